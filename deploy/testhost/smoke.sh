#!/bin/bash
# Boots one test guest on the test host (after `make testhost`) and checks,
# from the root namespace, everything the tests rely on:
#   - DHCP lease (virsh domifaddr --source lease) and guest agent (--source agent)
#   - the guest's forward proxy reaches a server on 198.18.0.1 (GET and CONNECT)
#   - the control API returns the seed's instance-id; proxy and agent stop/start
#   - ssh to the test host, and libvirt over ssh (libssh transport and ssh -L)
# Every wait is bounded. The smoke domain and its files are removed at the end
# (SMOKE_KEEP=1 leaves the domain running).
#
# SMOKE_NETWORK=static: the seed has a network-config as proxyfleet writes it
# for an address plan (the NIC matched by MAC, SMOKE_IP4/32 and SMOKE_IP6/128
# from the free halves of the egress blocks, on-link default routes via the
# network's addresses) instead of DHCP; the checks then go to those addresses,
# over IPv4 and IPv6, and check the address the guest leaves from.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ "$(id -u)" = 0 ] || die "run as root"
[ -f "$STATE/env" ] || die "no $STATE/env: run make testhost first"
source "$STATE/env"

DOM=${SMOKE_DOMAIN:-pftest-smoke}
SMOKE_DIR=/var/lib/proxyfleet-testhost/smoke
CONSOLE_LOG=/var/log/libvirt/qemu/$DOM-console.log
PORT=${SMOKE_PORT:-18080}
IID="smoke-$(date +%s)-$RANDOM"
NETMODE=${SMOKE_NETWORK:-dhcp}
case "$NETMODE" in
dhcp) ;;
static)
	: "${TESTHOST_EGRESS_IPV6_GATEWAY:?not in $STATE/env: run make testhost again}"
	IP4=${SMOKE_IP4:-198.18.101.254}
	IP6=${SMOKE_IP6:-2001:db8:101:0:8000::fe}
	MAC=${SMOKE_MAC:-52:54:00:5e:01:fe}
	;;
*) die "SMOKE_NETWORK=$NETMODE: want dhcp or static" ;;
esac
fails=0
httpd_pid=""
httpd6_pid=""
fwd_pid=""

ok() { echo "smoke: ok   $*"; }
bad() { echo "smoke: FAIL $*"; fails=$((fails + 1)); }
# cu: curl straight to a guest (never through an environment proxy).
cu() { curl --noproxy '*' -s "$@"; }
ms_since() { echo $(($(now_ms) - $1)); }

cleanup() {
	[ -n "$httpd_pid" ] && kill "$httpd_pid" 2>/dev/null
	[ -n "$httpd6_pid" ] && kill "$httpd6_pid" 2>/dev/null
	[ -n "$fwd_pid" ] && kill "$fwd_pid" 2>/dev/null
	virsh_ destroy "$DOM" >/dev/null 2>&1
	virsh_ undefine "$DOM" >/dev/null 2>&1
	rm -rf "$SMOKE_DIR" "$STATE/run/libvirt-fwd.sock"
	true
}
cleanup
if [ -n "${SMOKE_KEEP:-}" ]; then
	# Leave the domain running for debugging; the next run or testhost-down removes it.
	trap '[ -n "$httpd_pid" ] && kill "$httpd_pid"; [ -n "$fwd_pid" ] && kill "$fwd_pid"; true' EXIT
else
	trap cleanup EXIT
fi

# --- files for the domain -----------------------------------------------------
mkdir -p "$SMOKE_DIR/seed"
chmod 755 "$SMOKE_DIR"
cp "$TESTHOST_GUEST_KERNEL" "$SMOKE_DIR/vmlinuz"
cp "$TESTHOST_GUEST_INITRD" "$SMOKE_DIR/initrd.img"
cp "$TESTHOST_GUEST_DISK" "$SMOKE_DIR/disk.raw"
printf 'instance-id: %s\nlocal-hostname: %s\n' "$IID" "$DOM" >"$SMOKE_DIR/seed/meta-data"
printf '#cloud-config\n# smoke test\n' >"$SMOKE_DIR/seed/user-data"
seed_files=("$SMOKE_DIR/seed/user-data" "$SMOKE_DIR/seed/meta-data")
mac_xml=""
if [ "$NETMODE" = static ]; then
	cat >"$SMOKE_DIR/seed/network-config" <<EOF
version: 2
ethernets:
  eth0:
    match: {macaddress: "$MAC"}
    set-name: eth0
    dhcp4: false
    addresses: [$IP4/32, "$IP6/128"]
    routes:
      - {to: 0.0.0.0/0, via: $TESTHOST_EGRESS_IPV4_GATEWAY, on-link: true}
      - {to: "::/0", via: "$TESTHOST_EGRESS_IPV6_GATEWAY", on-link: true}
EOF
	seed_files+=("$SMOKE_DIR/seed/network-config")
	mac_xml="<mac address='$MAC'/>"
fi
if [ -n "${SMOKE_SEED_ISO:-}" ]; then
	# A seed made elsewhere (e.g. by the provider's ISO writer); its instance-id is SMOKE_INSTANCE_ID.
	cp "$SMOKE_SEED_ISO" "$SMOKE_DIR/seed.iso"
	IID=${SMOKE_INSTANCE_ID:?set SMOKE_INSTANCE_ID with SMOKE_SEED_ISO}
else
	genisoimage -quiet -output "$SMOKE_DIR/seed.iso" -volid cidata -joliet -rock \
		"${seed_files[@]}" || die "genisoimage failed"
fi
chmod 644 "$SMOKE_DIR"/*.*

# The seed as a read-only virtio disk (the default), or SMOKE_SEED_BUS=scsi: a
# CD-ROM on a virtio-scsi controller.
if [ "${SMOKE_SEED_BUS:-virtio}" = scsi ]; then
	seed_disk="    <controller type='scsi' model='virtio-scsi'/>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='$SMOKE_DIR/seed.iso'/>
      <target dev='sda' bus='scsi'/>
      <readonly/>
    </disk>"
else
	seed_disk="    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='$SMOKE_DIR/seed.iso'/>
      <target dev='vdb' bus='virtio'/>
      <readonly/>
    </disk>"
fi
cat >"$SMOKE_DIR/domain.xml" <<EOF
<domain type='qemu'>
  <name>$DOM</name>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>$SMOKE_DIR/vmlinuz</kernel>
    <initrd>$SMOKE_DIR/initrd.img</initrd>
    <cmdline>console=ttyS0</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='$SMOKE_DIR/disk.raw'/>
      <target dev='vda' bus='virtio'/>
    </disk>
$seed_disk
    <interface type='network'>
      $mac_xml
      <source network='$TESTHOST_NETWORK'/>
      <model type='virtio'/>
    </interface>
    <serial type='pty'>
      <log file='$CONSOLE_LOG' append='off'/>
      <target port='0'/>
    </serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <memballoon model='none'/>
  </devices>
</domain>
EOF

# --- boot -------------------------------------------------------------------
virsh_ define "$SMOKE_DIR/domain.xml" >/dev/null || die "define failed"
t0=$(now_ms)
virsh_ start "$DOM" >/dev/null || die "start failed"
echo "smoke: started $DOM (console log $CONSOLE_LOG)"

lease_ip() { virsh_ domifaddr "$DOM" --source lease 2>/dev/null | grep -o '198\.18\.100\.[0-9]*' | head -1; }
agent_ip() { virsh_ domifaddr "$DOM" --source agent 2>/dev/null | grep -o '198\.18\.10[01]\.[0-9]*' | head -1; }
has_lease() { [ -n "$(lease_ip)" ]; }
has_agent() { [ -n "$(agent_ip)" ]; }
agent_fails() { ! timeout 20 virsh -q -c "$URI" domifaddr "$DOM" --source agent >/dev/null 2>&1; }

if [ "$NETMODE" = static ]; then
	IP=$IP4
	if wait_until 120 cu --max-time 2 -o /dev/null "http://$IP:9090/healthz"; then
		ok "control API answers on $IP (static, from network-config) after $(ms_since "$t0") ms"
	else
		bad "control API not answering on $IP after 120 s"
		tail -40 "$CONSOLE_LOG" || true
		exit 1
	fi
	has_lease && bad "a DHCP lease $(lease_ip) with a static network-config" || ok "no DHCP lease"
else
	if wait_until 120 has_lease; then
		IP=$(lease_ip)
		ok "lease $IP after $(ms_since "$t0") ms (virsh start to lease)"
	else
		bad "no lease after 120 s"
		tail -40 "$CONSOLE_LOG" || true
		exit 1
	fi
fi
if wait_until 60 has_agent; then
	[ "$(agent_ip)" = "$IP" ] && ok "agent source answers $IP after $(ms_since "$t0") ms" || bad "agent says $(agent_ip), want $IP"
else
	bad "agent source has no address after 60 s"
fi
# The test host drops router advertisements on the VM network: no guest takes
# an IPv6 address it was not given.
grep -q '2001:db8:100:' <<<"$(virsh_ domifaddr "$DOM" --source agent 2>/dev/null)" &&
	bad "a SLAAC address on the VM network" || ok "no SLAAC address on the VM network"
if [ "$NETMODE" = static ]; then
	addrs=$(virsh_ domifaddr "$DOM" --source agent 2>/dev/null)
	grep -qF "$IP4/32" <<<"$addrs" && grep -qF "$IP6/128" <<<"$addrs" &&
		ok "agent lists $IP4/32 and $IP6/128" || bad "agent lists: $addrs"
	st=$(cu --max-time 5 "http://$IP:9090/healthz")
	grep -q '"network":"network-config"' <<<"$st" && ! grep -q network_error <<<"$st" &&
		ok "healthz: network from network-config" || bad "healthz: $st"
fi
grep -a 'testguest:' "$CONSOLE_LOG" | grep -aE 'has an address|ready after|seed:' | sed 's/^/smoke: guest: /' || true

# --- proxy ------------------------------------------------------------------
mkdir -p "$SMOKE_DIR/www"
token="proxyfleet-smoke-$RANDOM$RANDOM"
echo "$token" >"$SMOKE_DIR/www/index.html"
busybox httpd -f -vv -p "$ROOT_IP:$PORT" -h "$SMOKE_DIR/www" 2>"$SMOKE_DIR/httpd.log" &
httpd_pid=$!
wait_until 5 cu -f -o /dev/null "http://$ROOT_IP:$PORT/" || bad "local httpd on $ROOT_IP:$PORT did not start"
proxy_get() { curl -s --max-time 10 -x "http://$IP:3128" "http://$ROOT_IP:$PORT/"; }
proxy_tunnel() { curl -s --max-time 10 -p -x "http://$IP:3128" "http://$ROOT_IP:$PORT/"; }
wait_until 30 cu --max-time 2 -o /dev/null "http://$IP:9090/healthz" || bad "control API not answering"
[ "$(proxy_get)" = "$token" ] && ok "GET through proxy $IP:3128 reached $ROOT_IP:$PORT" || bad "GET through proxy returned '$(proxy_get)'"
[ "$(proxy_tunnel)" = "$token" ] && ok "CONNECT through proxy reached $ROOT_IP:$PORT" || bad "CONNECT through proxy failed"
if [ "$NETMODE" = static ]; then
	# The guest left from its plan's address; and the same over IPv6, both ways.
	grep -q "^$IP4:[0-9]*: url:/" "$SMOKE_DIR/httpd.log" && ok "the guest reached $ROOT_IP from $IP4" ||
		bad "httpd saw: $(head -3 "$SMOKE_DIR/httpd.log")"
	busybox httpd -f -vv -p "[$TESTHOST_ROOT_IP6]:$PORT" -h "$SMOKE_DIR/www" 2>"$SMOKE_DIR/httpd6.log" &
	httpd6_pid=$!
	wait_until 5 cu -g -f -o /dev/null "http://[$TESTHOST_ROOT_IP6]:$PORT/" || bad "local httpd on [$TESTHOST_ROOT_IP6]:$PORT did not start"
	got=$(curl -s -g --max-time 10 -x "http://$IP:3128" "http://[$TESTHOST_ROOT_IP6]:$PORT/")
	[ "$got" = "$token" ] && ok "GET through proxy reached [$TESTHOST_ROOT_IP6]:$PORT" || bad "GET to [$TESTHOST_ROOT_IP6] through proxy returned '$got'"
	grep -q "^\[$IP6\]:[0-9]*: url:/" "$SMOKE_DIR/httpd6.log" && ok "the guest reached $TESTHOST_ROOT_IP6 from $IP6" ||
		bad "httpd (IPv6) saw: $(head -3 "$SMOKE_DIR/httpd6.log")"
	kill "$httpd6_pid" 2>/dev/null
	httpd6_pid=""
	got=$(cu -g --max-time 5 "http://[$IP6]:9090/instance-id")
	[ "$got" = "$IID" ] && ok "control API over IPv6 at [$IP6]:9090" || bad "control API over IPv6: '$got'"
	got=$(curl -s -g --max-time 10 -x "http://[$IP6]:3128" "http://$ROOT_IP:$PORT/")
	[ "$got" = "$token" ] && ok "GET through proxy at [$IP6]:3128" || bad "GET through proxy at [$IP6]:3128 returned '$got'"
fi

# --- control API ------------------------------------------------------------
got=$(cu --max-time 5 "http://$IP:9090/instance-id")
[ "$got" = "$IID" ] && ok "instance-id $got from the seed" || bad "instance-id '$got', want '$IID'"
grep -q "instance-id: $IID" <<<"$(cu --max-time 5 "http://$IP:9090/meta-data")" && ok "meta-data served" || bad "meta-data"
cu --max-time 5 -X POST "http://$IP:9090/proxy/stop" >/dev/null
proxy_down() { ! curl -s --max-time 3 -o /dev/null -x "http://$IP:3128" "http://$ROOT_IP:$PORT/"; }
wait_until 10 proxy_down && ok "proxy/stop: proxy refuses" || bad "proxy still answers after proxy/stop"
cu --max-time 5 -X POST "http://$IP:9090/proxy/start" >/dev/null
proxy_up() { [ "$(proxy_get)" = "$token" ]; }
wait_until 10 proxy_up && ok "proxy/start: proxy answers again" || bad "proxy does not answer after proxy/start"

# --- agent stop/start -------------------------------------------------------
cu --max-time 5 -X POST "http://$IP:9090/agent/stop" >/dev/null
t=$(now_ms)
if wait_until 30 agent_fails; then
	ok "agent/stop: --source agent fails ($(virsh -q -c "$URI" domifaddr "$DOM" --source agent 2>&1 | tail -1)) after $(ms_since "$t") ms"
else
	bad "--source agent still answers after agent/stop"
fi
if [ "$NETMODE" = dhcp ]; then
	has_lease && ok "lease source still answers while the agent is stopped" || bad "lease source lost"
fi
cu --max-time 5 -X POST "http://$IP:9090/agent/start" >/dev/null
t=$(now_ms)
wait_until 30 has_agent && ok "agent/start: --source agent answers again after $(ms_since "$t") ms" || bad "agent does not answer after agent/start"

# --- ssh and libvirt over ssh -------------------------------------------------
sshopts=(-i "$TESTHOST_SSH_KEY" -o UserKnownHostsFile="$TESTHOST_KNOWN_HOSTS" -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5)
timeout 20 ssh "${sshopts[@]}" "root@$TESTHOST_NS_IP" true && ok "ssh root@$TESTHOST_NS_IP true" || bad "ssh"
uri="qemu+libssh://root@$TESTHOST_NS_IP/system?keyfile=$TESTHOST_SSH_KEY&known_hosts=$TESTHOST_KNOWN_HOSTS&known_hosts_verify=normal&sshauth=privkey"
if out=$(timeout 30 virsh -q -c "$uri" domstate "$DOM" 2>&1) && [ "$out" = running ]; then
	ok "virsh over qemu+libssh:// sees $DOM $out"
else
	bad "virsh over qemu+libssh://: $out"
fi
fwd=$STATE/run/libvirt-fwd.sock
rm -f "$fwd"
ssh "${sshopts[@]}" -N -o ExitOnForwardFailure=yes -L "$fwd:/run/libvirt/libvirt-sock" "root@$TESTHOST_NS_IP" &
fwd_pid=$!
if wait_until 15 test -S "$fwd" && out=$(timeout 20 virsh -q -c "qemu+unix:///system?socket=$fwd" domstate "$DOM" 2>&1) && [ "$out" = running ]; then
	ok "virsh through ssh -L of /run/libvirt/libvirt-sock sees $DOM $out"
else
	bad "virsh through ssh -L: ${out:-no socket}"
fi

# --- graceful stop through the agent -----------------------------------------
if [ -z "${SMOKE_KEEP:-}" ]; then
	t=$(now_ms)
	virsh_ shutdown "$DOM" --mode agent >/dev/null 2>&1
	dom_off() { [ "$(virsh_ domstate "$DOM" 2>/dev/null)" = "shut off" ]; }
	wait_until 30 dom_off && ok "virsh shutdown --mode agent: shut off after $(ms_since "$t") ms" || bad "domain still $(virsh_ domstate "$DOM" 2>&1) after shutdown --mode agent"
fi

# --- the default network must not run ---------------------------------------
net_active default && bad "libvirt's default network is active" || ok "default network inactive"

if [ "$fails" -gt 0 ]; then
	echo "smoke: $fails check(s) failed; console log tail:"
	tail -30 "$CONSOLE_LOG" || true
	exit 1
fi
echo "smoke: all checks passed in $(ms_since "$t0") ms"
