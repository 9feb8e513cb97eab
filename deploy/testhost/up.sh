#!/bin/bash
# Sets up proxyfleet's test host on this machine (run as root; see README.md):
# packages, network namespace $TESTHOST_NETNS (pftest) joined to the root
# namespace by a veth pair, virtlogd + libvirtd + sshd inside it, a libvirt
# storage pool and network, the test guest, and .testhost/env + proxyfleet.yaml.
# Idempotent: rerun it after a crash or a SIGKILL of anything it started.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
# One set-up or tear-down at a time on this machine (checkouts share the host).
# Daemons are started with fd 9 closed, or they would hold the lock forever.
exec 9>/run/proxyfleet-testhost.lock
flock -w 900 9 || die "another up.sh/down.sh holds /run/proxyfleet-testhost.lock"
t_start=$(now_ms)
mkdir -p "$STATE"/{run,logs,sshd}
chmod 700 "$STATE/sshd"

# --- packages ---------------------------------------------------------------
missing=()
for p in "${PKGS[@]}"; do
	s=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$s" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	t=$(now_ms)
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q -o DPkg::Lock::Timeout=600
	apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${PKGS[@]}"
	log "apt took $(( ($(now_ms) - t) / 1000 ))s"
fi
command -v go >/dev/null || die "go not found (expected /usr/local/go/bin/go)"

# --- the test guest ---------------------------------------------------------
# The Debian root deploy/systemd_boot_test.go boots under systemd-nspawn
# (deploy/nspawn/; cached like the guests: a cold build takes about a
# minute, here beside theirs).
bash "$repo/deploy/nspawn/build.sh" >"$STATE/logs/nspawn-root.log" 2>&1 &
nspawn_build=$!
bash "$here/build-guest.sh"
# The Debian proxy guest (deploy/guest/; cached: a rerun with the same inputs
# takes well under a second, a cold build about three minutes).
dg=${GUEST_DIR:-$repo/.guest}
case "$dg" in /*) ;; *) dg=$PWD/$dg ;; esac
GUEST_DIR=$dg bash "$repo/deploy/guest/build.sh"
if ! wait "$nspawn_build"; then
	cat "$STATE/logs/nspawn-root.log" >&2
	die "deploy/nspawn/build.sh failed"
fi
log "$(tail -n 1 "$STATE/logs/nspawn-root.log")"

# --- network namespace ------------------------------------------------------
if ! ip netns exec "$NS" true 2>/dev/null; then
	ip netns del "$NS" 2>/dev/null || rm -f "/run/netns/$NS"
	log "creating netns $NS"
	ip netns add "$NS"
fi
ip -n "$NS" link set lo up
# A veth whose peer is not in our namespace (left over from a deleted one) is rebuilt.
if ! ip link show "$VETH_ROOT" >/dev/null 2>&1 || ! ip -n "$NS" link show "$VETH_NS" >/dev/null 2>&1; then
	ip link del "$VETH_ROOT" 2>/dev/null || true
	ip -n "$NS" link del "$VETH_NS" 2>/dev/null || true
	ip link add "$VETH_ROOT" type veth peer name "$VETH_NS" netns "$NS"
fi
ip addr replace "$ROOT_IP/30" dev "$VETH_ROOT"
ip link set "$VETH_ROOT" up
ip -n "$NS" addr replace "$NS_IP/30" dev "$VETH_NS"
ip -n "$NS" link set "$VETH_NS" up
ip -n "$NS" route replace default via "$ROOT_IP" dev "$VETH_NS"
ip netns exec "$NS" sysctl -qw net.ipv4.ip_forward=1
ip route replace "$VM_NET" via "$NS_IP" dev "$VETH_ROOT"
ip route replace "$EGRESS4" via "$NS_IP" dev "$VETH_ROOT"
# IPv6 on the veth pair (nodad: usable at once). No IPv6 default route in the
# namespace: guests reach the root namespace's address over the veth's /64,
# and nothing else (test traffic stays inside 2001:db8::/32 and these hosts).
sysctl -qw "net.ipv6.conf.$VETH_ROOT.disable_ipv6=0"
ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0 \
	"net.ipv6.conf.$VETH_NS.disable_ipv6=0" net.ipv6.conf.all.forwarding=1
ip -6 addr replace "$ROOT_IP6/64" dev "$VETH_ROOT" nodad
ip -n "$NS" -6 addr replace "$NS_IP6/64" dev "$VETH_NS" nodad
ip -6 route replace "$VM_NET6" via "$NS_IP6" dev "$VETH_ROOT"
ip -6 route replace "$EGRESS6" via "$NS_IP6" dev "$VETH_ROOT"
# Interfaces made from now on in the namespace (the bridge, the taps) skip
# duplicate address detection: without it the bridge's IPv6 address stays
# tentative, unreachable, until the first guest gives the bridge a carrier.
ip netns exec "$NS" sysctl -qw net.ipv6.conf.default.accept_dad=0
# No router advertisements on the VM network. libvirt has dnsmasq announce the
# network's /64 (dhcp-range=…,ra-only); every guest then takes a SLAAC address
# in it and a default route nobody planned, and an IPv6 test could not tell
# whether a guest left from its plan's address. Guests get IPv6 only from
# their seed's network-config.
ra_drop=(OUTPUT -o "$BRIDGE" -p ipv6-icmp --icmpv6-type router-advertisement -j DROP)
ip netns exec "$NS" ip6tables -w -C "${ra_drop[@]}" 2>/dev/null ||
	ip netns exec "$NS" ip6tables -w -A "${ra_drop[@]}"

# --- libvirt daemons in the namespace ----------------------------------------
# Never let libvirt autostart its 'default' network (a private-range NAT network).
rm -f /etc/libvirt/qemu/networks/autostart/default.xml

# ensure_daemon NAME PIDFILE CMD...: keep a live daemon that runs in our
# namespace; otherwise stop it (by its pid file) and start a fresh one.
#
# detached CMD… runs CMD with no descriptor above 2 open: a daemon must
# not keep a lock its caller holds (this script's own on fd 9, or one that
# a caller of `make testhost` took with flock(1) on a descriptor of its
# choosing), or it holds the lock for as long as it runs and every later
# `flock` waits forever.
detached() {
	(
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-"; fi
		done
		exec "$@"
	)
}
ensure_daemon() {
	local name=$1 pidfile=$2; shift 2
	local pid
	pid=$(tr -dc 0-9 2>/dev/null <"$pidfile" || true)
	if pid_alive "$pid" "$name" && pid_in_ns "$pid" && logs_here "$pid" "$name"; then
		return 0
	fi
	kill_pidfile "$pidfile" "$name"
	log "starting $name in netns $NS"
	detached ip netns exec "$NS" "$@"
}
ensure_daemon virtlogd /run/virtlogd.pid env LIBVIRT_LOG_OUTPUTS="3:file:$STATE/logs/virtlogd.log" virtlogd -d
wait_until 10 test -S /run/libvirt/virtlogd-sock || die "virtlogd did not start"
pid=$(tr -dc 0-9 2>/dev/null </run/libvirtd.pid || true)
if pid_alive "$pid" libvirtd && pid_in_ns "$pid" && logs_here "$pid" libvirtd && libvirt_up; then
	:
else
	kill_pidfile /run/libvirtd.pid libvirtd
	rm -f /etc/libvirt/qemu/networks/autostart/default.xml
	log "starting libvirtd in netns $NS"
	detached ip netns exec "$NS" env LIBVIRT_LOG_OUTPUTS="3:file:$STATE/logs/libvirtd.log" libvirtd -d
fi
wait_until 30 libvirt_up || die "libvirtd is not answering on $URI after 30s"
log "libvirtd answers"

# The 'default' network must never run.
if virsh_ net-info default >/dev/null 2>&1; then
	virsh_ net-autostart default --disable >/dev/null 2>&1 || true
	if net_active default; then
		log "stopping libvirt's default network"
		virsh_ net-destroy default >/dev/null
	fi
fi

# --- storage pool -----------------------------------------------------------
pool_xml="<pool type='dir'><name>$POOL</name><target><path>$POOL_DIR</path></target></pool>"
if virsh_ pool-info "$POOL" >/dev/null 2>&1; then
	if [ "$(virsh_ pool-dumpxml "$POOL" | sed -n 's:.*<path>\(.*\)</path>.*:\1:p' | head -1)" != "$POOL_DIR" ] ||
		! grep -q "type='dir'" <<<"$(virsh_ pool-dumpxml "$POOL")"; then
		log "pool $POOL has another definition: redefining"
		virsh_ pool-destroy "$POOL" >/dev/null 2>&1 || true
		virsh_ pool-undefine "$POOL" >/dev/null 2>&1 || true
	fi
fi
if ! virsh_ pool-info "$POOL" >/dev/null 2>&1; then
	printf '%s\n' "$pool_xml" >"$STATE/run/pool.xml"
	virsh_ pool-define "$STATE/run/pool.xml" >/dev/null
fi
mkdir -p "$POOL_DIR"
if ! grep -q '^State:.*running' <<<"$(virsh_ pool-info "$POOL")"; then
	virsh_ pool-build "$POOL" >/dev/null 2>&1 || true
	virsh_ pool-start "$POOL" >/dev/null
fi
virsh_ pool-autostart "$POOL" >/dev/null
virsh_ pool-refresh "$POOL" >/dev/null

log "pool $POOL ready"

# --- VM network -------------------------------------------------------------
# no-ping: dnsmasq otherwise pings an address for ~3 s before offering it.
# no-resolv: the namespace reaches no resolver (the host's would be outside
# the test ranges), so dnsmasq answers what it knows (leases, dns-host
# entries a test adds) and refuses the rest at once instead of forwarding
# it to be lost (a query for a name it has only an IPv4 address of, AAAA,
# would hang its asker until its DNS timeout).
net_xml="<network xmlns:dnsmasq='http://libvirt.org/schemas/network/dnsmasq/1.0'>
  <name>$NETWORK</name>
  <forward mode='open'/>
  <bridge name='$BRIDGE' stp='off' delay='0'/>
  <ip address='$BRIDGE_IP' netmask='255.255.255.0'>
    <dhcp>
      <range start='198.18.100.10' end='198.18.100.250'/>
    </dhcp>
  </ip>
  <ip family='ipv6' address='$BRIDGE_IP6' prefix='64'/>
  <dnsmasq:options>
    <dnsmasq:option value='no-ping'/>
    <dnsmasq:option value='no-resolv'/>
  </dnsmasq:options>
</network>"
if virsh_ net-info "$NETWORK" >/dev/null 2>&1; then
	cur=$(virsh_ net-dumpxml --inactive "$NETWORK")
	if ! grep -q "<forward mode='open'/>" <<<"$cur" || ! grep -q "name='$BRIDGE'" <<<"$cur" ||
		! grep -q "address='$BRIDGE_IP'" <<<"$cur" || ! grep -q "start='198.18.100.10' end='198.18.100.250'" <<<"$cur" || ! grep -q "no-ping" <<<"$cur" || ! grep -q "no-resolv" <<<"$cur" ||
		! grep -q "family='ipv6' address='$BRIDGE_IP6' prefix='64'" <<<"$cur"; then
		log "network $NETWORK has another definition: redefining"
		virsh_ net-destroy "$NETWORK" >/dev/null 2>&1 || true
		virsh_ net-undefine "$NETWORK" >/dev/null 2>&1 || true
	fi
fi
if ! virsh_ net-info "$NETWORK" >/dev/null 2>&1; then
	printf '%s\n' "$net_xml" >"$STATE/run/network.xml"
	virsh_ net-define "$STATE/run/network.xml" >/dev/null
fi
net_healthy() {
	net_active "$NETWORK" || return 1
	grep -q "inet $BRIDGE_IP/24" <<<"$(ip -n "$NS" -4 addr show dev "$BRIDGE" 2>/dev/null)" || return 1
	grep -q "inet6 $BRIDGE_IP6/64" <<<"$(ip -n "$NS" -6 addr show dev "$BRIDGE" 2>/dev/null)" || return 1
	local p
	p=$(tr -dc 0-9 2>/dev/null <"/run/libvirt/network/$NETWORK.pid" || true)
	pid_alive "$p" dnsmasq && pid_in_ns "$p"
}
if ! net_healthy; then
	if net_active "$NETWORK"; then
		log "network $NETWORK is active but broken (bridge or dnsmasq missing): restarting it"
		virsh_ net-destroy "$NETWORK" >/dev/null
	fi
	virsh_ net-start "$NETWORK" >/dev/null
fi
virsh_ net-autostart "$NETWORK" --disable >/dev/null
wait_until 10 net_healthy || die "network $NETWORK did not come up"
# The egress blocks live on the bridge: guests hold /32s and /128s of them
# with an on-link default route via the bridge's addresses. These routes go
# with the bridge, so they are (re)made whenever the network is up.
ip netns exec "$NS" sysctl -qw "net.ipv6.conf.$BRIDGE.disable_ipv6=0" net.ipv6.conf.all.forwarding=1
ip -n "$NS" route replace "$EGRESS4" dev "$BRIDGE"
ip -n "$NS" -6 route replace "$EGRESS6" dev "$BRIDGE"
log "network $NETWORK ready"

# --- sshd in the namespace ----------------------------------------------------
hostkey=$STATE/sshd/ssh_host_ed25519_key
clientkey=$STATE/client_key
authkeys=$STATE/sshd/authorized_keys
known=$STATE/known_hosts
sshd_conf=$STATE/sshd/sshd_config
sshd_pid=$STATE/run/sshd.pid
[ -s "$hostkey" ] || ssh-keygen -q -t ed25519 -N '' -C "proxyfleet-testhost-host" -f "$hostkey"
[ -s "$clientkey" ] || ssh-keygen -q -t ed25519 -N '' -C "proxyfleet-testhost-client" -f "$clientkey"
cp "$clientkey.pub" "$authkeys"
chmod 600 "$authkeys" "$hostkey" "$clientkey"
echo "$NS_IP $(cut -d' ' -f1,2 "$hostkey.pub")" >"$known"
chmod 644 "$known"
cat >"$sshd_conf.new" <<EOF
# proxyfleet test host sshd (generated by deploy/testhost/up.sh)
# started in its own mount namespace with root's shell rc files masked (v2)
ListenAddress $NS_IP:22
HostKey $hostkey
PidFile $sshd_pid
AuthorizedKeysFile $authkeys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
StreamLocalBindUnlink yes
MaxSessions 200
MaxStartups 200:30:400
LogLevel VERBOSE
Subsystem sftp internal-sftp
EOF
mkdir -p /run/sshd
chmod 755 /run/sshd
pid=$(tr -dc 0-9 2>/dev/null <"$sshd_pid" || true)
if pid_alive "$pid" sshd && pid_in_ns "$pid" && cmp -s "$sshd_conf" "$sshd_conf.new"; then
	rm -f "$sshd_conf.new"
else
	kill_pidfile "$sshd_pid" sshd
	# Another listener on the test host's port (pid file lost, or started from
	# another checkout with other keys) would keep ours from binding.
	for p in $(ip netns exec "$NS" ss -Htlnp "sport = :22" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
		pid_alive "$p" sshd || continue
		log "stopping the sshd already listening on $NS_IP:22 (pid $p)"
		kill -TERM "$p" 2>/dev/null || true
		for _ in $(seq 30); do pid_alive "$p" sshd || break; sleep 0.1; done
	done
	mv -f "$sshd_conf.new" "$sshd_conf"
	/usr/sbin/sshd -t -f "$sshd_conf" || die "sshd config test failed"
	log "starting sshd on $NS_IP:22 in netns $NS"
	# The test host stands for a bare KVM host: the sessions it runs (the
	# libvirt tunnel, virsh in the bench) must not run this machine's own
	# shell set-up. Root's .bashrc here runs `pyenv init`, whose rehash waits
	# 60 s on a lock that one killed session leaves behind; each ssh command
	# then took a minute and CI failed on "does not answer". So sshd runs in a
	# mount namespace of its own where those files read as empty.
	detached ip netns exec "$NS" unshare --mount --propagation private sh -c '
		home=$(getent passwd root | cut -d: -f6)
		for f in .bashrc .bash_profile .bash_login .profile; do
			[ -f "$home/$f" ] && mount --bind /dev/null "$home/$f"
		done
		exec /usr/sbin/sshd -f "$1" -E "$2"' sh "$sshd_conf" "$STATE/logs/sshd.log"
fi
ssh_ok() {
	timeout 10 ssh -q -i "$clientkey" -o UserKnownHostsFile="$known" -o StrictHostKeyChecking=yes \
		-o BatchMode=yes -o ConnectTimeout=3 "root@$NS_IP" true
}
wait_until 20 ssh_ok || die "ssh root@$NS_IP does not answer (see $STATE/logs/sshd.log)"

# --- config and environment for the tests -----------------------------------
# The proxies' password (proxy.auth): made once per checkout, only root reads it.
proxy_pw=$STATE/proxy_password
if [ ! -s "$proxy_pw" ]; then
	(umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$proxy_pw.new" && mv -f "$proxy_pw.new" "$proxy_pw")
fi
chmod 600 "$proxy_pw"
g=$STATE/guest
sum() { cat "$g/$1.sha256"; }
dsum() { cat "$dg/$1.sha256"; }
# config_yaml [PLAN]: the test host's config; PLAN (lines) goes into th1.
config_yaml() {
	cat <<EOF
# Generated by deploy/testhost/up.sh for the test host in netns $NS.
nats: {url: ""}
hosts:
  - name: th1
    driver: kvm
    ssh: {address: "$NS_IP:22", user: root, key_file: $clientkey, known_hosts: $known}
    socket: /run/libvirt/libvirt-sock
    uri: qemu:///system
    pool: $POOL
    network: $NETWORK
    domain_type: qemu
    max_proxies: 20
    budgets: {call: 30s, transfer_stall: 30s, close: 5s}
${1:-}images:
  - name: testguest
    url: file://$g/disk.raw
    sha256: "$(sum disk.raw)"
    format: raw
    kernel: {url: "file://$g/vmlinuz", sha256: "$(sum vmlinuz)"}
    initrd: {url: "file://$g/initrd.img", sha256: "$(sum initrd.img)"}
    cmdline: "console=ttyS0"
default_image: testguest
proxy:
  port: 3128
  cpus: 1
  memory_mib: 128
  # Every proxy needs this credential, and only the test network may use one.
  auth: {user: fleet, password_file: $proxy_pw}
  allow: [198.18.0.0/15]
EOF
}
# th1's address plan: the lower halves of the egress blocks; the upper halves
# stay free for tests' own plans. The gateways are left to their defaults, the
# network's own addresses ($BRIDGE_IP, $BRIDGE_IP6).
config_yaml "    addresses:
      ipv4: [$EGRESS4_CONFIG]
      ipv6: [\"$EGRESS6_CONFIG\"]
      ipv6_per_proxy: 16
" >"$STATE/proxyfleet.yaml.new"
mv -f "$STATE/proxyfleet.yaml.new" "$STATE/proxyfleet.yaml"
rm -f "$STATE/proxyfleet-plan.yaml"
cat >"$STATE/env.new" <<EOF
export TESTHOST_NETNS=$NS
export TESTHOST_ROOT_IP=$ROOT_IP
export TESTHOST_NS_IP=$NS_IP
export TESTHOST_BRIDGE_IP=$BRIDGE_IP
export TESTHOST_ROOT_IP6=$ROOT_IP6
export TESTHOST_NS_IP6=$NS_IP6
export TESTHOST_BRIDGE_IP6=$BRIDGE_IP6
export TESTHOST_EGRESS_IPV4=$EGRESS4
export TESTHOST_EGRESS_IPV4_CONFIG=$EGRESS4_CONFIG
export TESTHOST_EGRESS_IPV4_FREE=$EGRESS4_FREE
export TESTHOST_EGRESS_IPV4_GATEWAY=$BRIDGE_IP
export TESTHOST_EGRESS_IPV6=$EGRESS6
export TESTHOST_EGRESS_IPV6_CONFIG=$EGRESS6_CONFIG
export TESTHOST_EGRESS_IPV6_FREE=$EGRESS6_FREE
export TESTHOST_EGRESS_IPV6_GATEWAY=$BRIDGE_IP6
export TESTHOST_SSH_ADDR=$NS_IP:22
export TESTHOST_SSH_USER=root
export TESTHOST_SSH_KEY=$clientkey
export TESTHOST_KNOWN_HOSTS=$known
export TESTHOST_LIBVIRT_SOCKET=/run/libvirt/libvirt-sock
export TESTHOST_URI=$URI
export TESTHOST_POOL=$POOL
export TESTHOST_NETWORK=$NETWORK
export TESTHOST_GUEST_KERNEL=$g/vmlinuz
export TESTHOST_GUEST_KERNEL_SHA256=$(sum vmlinuz)
export TESTHOST_GUEST_INITRD=$g/initrd.img
export TESTHOST_GUEST_INITRD_SHA256=$(sum initrd.img)
export TESTHOST_GUEST_DISK=$g/disk.raw
export TESTHOST_GUEST_DISK_SHA256=$(sum disk.raw)
export TESTHOST_GUEST_CMDLINE='console=ttyS0'
export TESTHOST_PROXY_USER=fleet
export TESTHOST_PROXY_PASSWORD_FILE=$proxy_pw
export TESTHOST_DEBIAN_DISK=$dg/disk.qcow2
export TESTHOST_DEBIAN_DISK_SHA256=$(dsum disk.qcow2)
export TESTHOST_DEBIAN_KERNEL=$dg/vmlinuz
export TESTHOST_DEBIAN_KERNEL_SHA256=$(dsum vmlinuz)
export TESTHOST_DEBIAN_INITRD=$dg/initrd.img
export TESTHOST_DEBIAN_INITRD_SHA256=$(dsum initrd.img)
export TESTHOST_DEBIAN_CMDLINE='$(cat "$dg/cmdline")'
export TESTHOST_DEBIAN_IMAGE_YAML=$dg/image.yaml
export PROXYFLEET_CONFIG=$STATE/proxyfleet.yaml
EOF
mv -f "$STATE/env.new" "$STATE/env"
log "ready in $(( ($(now_ms) - t_start) / 1000 ))s: source $STATE/env"
