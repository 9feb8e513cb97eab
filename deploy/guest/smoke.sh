#!/bin/bash
# Boots the Debian proxy guest (.guest/, made by build.sh) on the test host
# (after `make testhost`) with a seed like the one proxyfleet writes, and
# checks it from the root namespace:
#   - seconds from `virsh start` to the DHCP lease, the agent answering (with
#     the seed's hostname) and squid serving with the seed's config;
#   - through squid to an echo server on 198.18.0.1: 200 with the password,
#     407 without or with a wrong one, no Via/X-Forwarded-For/Forwarded/
#     Proxy-Authorization at the target, the guest's address as the source,
#     CONNECT with the password; the guest's own addresses refused;
#   - `cloud-init status --long`, squid's state and `squid -k parse` in the
#     guest (through the agent's guest-exec).
# Every wait is bounded. The domain and its files are removed at the end
# (GUEST_SMOKE_KEEP=1 leaves the domain running; the next run removes it).
# GUEST_SMOKE_USER_DATA=FILE boots with another user-data (@PASSWD_HASH@ in
# it becomes the bcrypt hash of the password).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../testhost/lib.sh"
[ "$(id -u)" = 0 ] || die "run as root"
libvirt_up || die "libvirtd does not answer on $URI: run make testhost first"

GUEST=${GUEST_DIR:-$repo/.guest}
DOM=${GUEST_SMOKE_DOMAIN:-pf-guest-smoke}
DIR=/var/lib/proxyfleet-testhost/$DOM
CONSOLE_LOG=/var/log/libvirt/qemu/$DOM-console.log
PORT=${GUEST_SMOKE_PORT:-18081}
PROXY_USER=fleet
PROXY_PASS=s3cret
HOSTNAME_=p1
IID=p1-test1
BOOT_WAIT=${GUEST_SMOKE_BOOT_WAIT:-300}
fails=0
httpd_pid=""

ok() { echo "guest-smoke: ok   $*"; }
bad() { echo "guest-smoke: FAIL $*"; fails=$((fails + 1)); }
info() { echo "guest-smoke: $*"; }
secs_since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

cleanup() {
	[ -n "$httpd_pid" ] && kill "$httpd_pid" 2>/dev/null
	virsh_ destroy "$DOM" >/dev/null 2>&1
	virsh_ undefine "$DOM" >/dev/null 2>&1
	rm -rf "$DIR"
	true
}
cleanup
if [ -n "${GUEST_SMOKE_KEEP:-}" ]; then
	trap '[ -n "$httpd_pid" ] && kill "$httpd_pid"; true' EXIT
else
	trap cleanup EXIT
fi
for f in disk.qcow2 vmlinuz initrd.img; do
	[ -s "$GUEST/$f" ] || die "no $GUEST/$f: run make guest-image first"
done

# --- the seed, as proxyfleet writes it ----------------------------------------
mkdir -p "$DIR/seed"
chmod 755 "$DIR"
hash=$(python3 -W ignore -c 'import crypt, sys; print(crypt.crypt(sys.argv[1], "$2a$10$" + crypt.mksalt(crypt.METHOD_BLOWFISH)[-22:]))' "$PROXY_PASS") ||
	die "python3 crypt could not make a bcrypt hash"
case "$hash" in '$2a$10$'*) ;; *) die "not a bcrypt hash: $hash" ;; esac
printf 'instance-id: "%s"\nlocal-hostname: "%s"\n' "$IID" "$HOSTNAME_" >"$DIR/seed/meta-data"
if [ -n "${GUEST_SMOKE_USER_DATA:-}" ]; then
	sed "s|@PASSWD_HASH@|$hash|" "$GUEST_SMOKE_USER_DATA" >"$DIR/seed/user-data"
else
	cat >"$DIR/seed/user-data" <<EOF
#cloud-config
hostname: "$HOSTNAME_"
write_files:
- path: /etc/squid/squid.conf
  permissions: "0644"
  content: |
    # Written by proxyfleet for proxy $HOSTNAME_.
    http_port 3128
    auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/proxyfleet.passwd
    auth_param basic children 2 startup=1 idle=1
    auth_param basic realm proxyfleet
    auth_param basic credentialsttl 1 hour
    acl proxyfleet_users proxy_auth REQUIRED
    acl proxyfleet_allow src 198.18.0.0/15
    acl proxyfleet_guest dst 127.0.0.0/8 ::1 169.254.0.0/16 fe80::/10
    http_access deny proxyfleet_guest
    http_access deny !proxyfleet_allow
    http_access allow proxyfleet_users
    http_access deny all
    via off
    forwarded_for delete
    request_header_access X-Forwarded-For deny all
    request_header_access Forwarded deny all
    request_header_access Via deny all
    reply_header_access X-Cache deny all
    reply_header_access X-Cache-Lookup deny all
    reply_header_access Via deny all
    httpd_suppress_version_string on
    cache deny all
    cache_mem 8 MB
    access_log none
    shutdown_lifetime 1 seconds
    coredump_dir /var/spool/squid
- path: /etc/squid/proxyfleet.passwd
  owner: root:proxy
  permissions: "0640"
  content: |
    $PROXY_USER:$hash
runcmd:
- [sh, -c, 'command -v squid >/dev/null 2>&1 || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold squid qemu-guest-agent; }']
- [systemctl, start, qemu-guest-agent]
- [systemctl, enable, squid]
- [systemctl, restart, squid]
EOF
fi
# GUEST_SMOKE_MKISO=CMD writes the ISO instead (CMD OUT.iso META-DATA USER-DATA),
# e.g. a program using the ISO writer proxyfleet's kvm/seed.go uses.
if [ -n "${GUEST_SMOKE_MKISO:-}" ]; then
	$GUEST_SMOKE_MKISO "$DIR/seed.iso" "$DIR/seed/meta-data" "$DIR/seed/user-data" || die "$GUEST_SMOKE_MKISO failed"
else
	genisoimage -quiet -output "$DIR/seed.iso" -volid cidata -joliet -rock "$DIR/seed/user-data" "$DIR/seed/meta-data" ||
		die "genisoimage failed"
fi

# --- the domain: a copy of the base, an overlay on it, direct kernel boot ------
cp "$GUEST/disk.qcow2" "$DIR/base.qcow2"
cp "$GUEST/vmlinuz" "$GUEST/initrd.img" "$DIR/"
qemu-img create -q -f qcow2 -F qcow2 -b "$DIR/base.qcow2" "$DIR/disk.qcow2" || die "qemu-img create failed"
cmdline=$(sed -n 's/^ *cmdline: "\(.*\)"$/\1/p' "$GUEST/image.yaml")
[ -n "$cmdline" ] || die "no cmdline in $GUEST/image.yaml"
chmod 644 "$DIR"/*.*
cat >"$DIR/domain.xml" <<EOF
<domain type='qemu'>
  <name>$DOM</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>$DIR/vmlinuz</kernel>
    <initrd>$DIR/initrd.img</initrd>
    <cmdline>$cmdline</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$DIR/disk.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='$DIR/seed.iso'/>
      <target dev='vdb' bus='virtio'/>
      <readonly/>
    </disk>
    <interface type='network'>
      <source network='$NETWORK'/>
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

# --- the echo server in the root namespace ------------------------------------
# It answers every GET with the client's address and the request's headers.
cat >"$DIR/echo.py" <<'EOF'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = ("client: %s\n" % self.client_address[0] + str(self.headers)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
EOF
python3 "$DIR/echo.py" "$ROOT_IP" "$PORT" &
httpd_pid=$!
wait_until 5 curl --noproxy '*' -sf -o /dev/null "http://$ROOT_IP:$PORT/" || die "echo server on $ROOT_IP:$PORT did not start"

# --- boot and time it ---------------------------------------------------------
agent() { timeout 20 virsh -q -c "$URI" qemu-agent-command "$DOM" "$1" 2>/dev/null; }
lease_ip() { virsh_ domifaddr "$DOM" --source lease 2>/dev/null | grep -o '198\.18\.100\.[0-9]*' | head -1; }
agent_ip() { virsh_ domifaddr "$DOM" --source agent 2>/dev/null | grep -o '198\.18\.100\.[0-9]*' | head -1; }
agent_host() { agent '{"execute":"guest-get-host-name"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["return"]["host-name"])' 2>/dev/null; }
# pcurl ARGS...: curl through the guest's squid to the echo server; prints the HTTP code.
pcurl() { curl --noproxy '' -s --max-time 5 -o "$DIR/body" -w '%{http_code}' "$@" "http://$ROOT_IP:$PORT/"; }

virsh_ define "$DIR/domain.xml" >/dev/null || die "define failed"
t0=$(now_ms)
virsh_ start "$DOM" >/dev/null || die "start failed"
info "started $DOM (console log $CONSOLE_LOG)"
IP="" t_lease="" t_agent="" t_host="" t_squid="" t_squid_any=""
end=$(($(date +%s) + BOOT_WAIT))
while [ "$(date +%s)" -lt "$end" ]; do
	[ -z "$IP" ] && IP=$(lease_ip) && [ -n "$IP" ] && t_lease=$(secs_since "$t0") && info "lease $IP after ${t_lease}s"
	if [ -z "$t_agent" ] && agent '{"execute":"guest-ping"}' >/dev/null; then
		t_agent=$(secs_since "$t0"); info "agent answers guest-ping after ${t_agent}s"
	fi
	if [ -n "$t_agent" ] && [ -z "$t_host" ] && [ "$(agent_host)" = "$HOSTNAME_" ]; then
		t_host=$(secs_since "$t0"); info "agent says host name $HOSTNAME_ after ${t_host}s"
	fi
	if [ -n "$IP" ] && [ -z "$t_squid_any" ] && [ "$(pcurl -x "http://$IP:3128")" != 000 ]; then
		t_squid_any=$(secs_since "$t0"); info "port 3128 answers HTTP after ${t_squid_any}s"
	fi
	if [ -n "$IP" ] && [ -z "$t_squid" ] && [ "$(pcurl -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128")" = 200 ]; then
		t_squid=$(secs_since "$t0"); info "squid serves with the seed's password after ${t_squid}s"
	fi
	[ -n "$IP" ] && [ -n "$t_host" ] && [ -n "$t_squid" ] && break
	sleep 0.5
done
[ -n "$IP" ] || { bad "no lease after ${BOOT_WAIT}s"; tail -40 "$CONSOLE_LOG"; exit 1; }
[ -n "$t_agent" ] && ok "agent answers (${t_agent}s)" || bad "agent did not answer in ${BOOT_WAIT}s"
[ -n "$t_host" ] && ok "guest-get-host-name is $HOSTNAME_ (${t_host}s)" || bad "guest-get-host-name: '$(agent_host)'"
[ -n "$t_squid" ] && ok "squid serves with the password (${t_squid}s)" || bad "squid did not serve in ${BOOT_WAIT}s"
[ "$(agent_ip)" = "$IP" ] && ok "domifaddr --source agent: $IP" || bad "domifaddr --source agent: '$(agent_ip)', lease $IP"
# GUEST_SMOKE_WATCH=SECONDS: after squid first served, keep asking every
# 0.5 s and count the answers that were not 200 (a restart by runcmd shows here).
if [ -n "$t_squid" ] && [ "${GUEST_SMOKE_WATCH:-0}" -gt 0 ]; then
	n=0 miss=0 first_miss="" last_miss=""
	wend=$(($(date +%s) + GUEST_SMOKE_WATCH))
	while [ "$(date +%s)" -lt "$wend" ]; do
		n=$((n + 1))
		if [ "$(pcurl -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128")" != 200 ]; then
			miss=$((miss + 1)); last_miss=$(secs_since "$t0"); [ -n "$first_miss" ] || first_miss=$last_miss
		fi
		sleep 0.5
	done
	[ "$miss" = 0 ] && ok "squid served all $n requests in the ${GUEST_SMOKE_WATCH}s after it first served" ||
		info "squid failed $miss of $n requests in the ${GUEST_SMOKE_WATCH}s after it first served (from ${first_miss}s to ${last_miss}s)"
fi

# --- the proxy's behaviour ----------------------------------------------------
code=$(pcurl -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128")
[ "$code" = 200 ] && ok "GET with the password: 200" || bad "GET with the password: $code"
info "the target saw:"; sed 's/^/guest-smoke:   | /' "$DIR/body"
leaked=$(grep -iE '^(via|x-forwarded-for|forwarded|proxy-authorization|x-cache|x-squid-error):' "$DIR/body")
[ -z "$leaked" ] && ok "no Via, X-Forwarded-For, Forwarded or Proxy-Authorization at the target" || bad "the target saw: $leaked"
# squid adds "Cache-Control: max-age=<refresh_pattern max>" to a request
# that has no max-age or no-cache of its own (README.md: how to stop it).
cc=$(grep -i '^cache-control:' "$DIR/body" | tr -d '\r')
[ -z "$cc" ] && ok "no Cache-Control added" || info "WARN the target saw '$cc', which the client did not send (squid adds it)"
src=$(sed -n 's/^client: //p' "$DIR/body")
[ "$src" = "$IP" ] && ok "source address $src is the guest's" || bad "source address '$src', guest $IP"
code=$(pcurl -x "http://$IP:3128")
[ "$code" = 407 ] && ok "GET without a password: 407" || bad "GET without a password: $code"
code=$(pcurl -x "http://$PROXY_USER:wrong@$IP:3128")
[ "$code" = 407 ] && ok "GET with a wrong password: 407" || bad "GET with a wrong password: $code"
code=$(pcurl -x "http://nobody:$PROXY_PASS@$IP:3128")
[ "$code" = 407 ] && ok "GET as an unknown user: 407" || bad "GET as an unknown user: $code"
hdrs=$(curl --noproxy '' -s --max-time 5 -o /dev/null -D - -x "http://$IP:3128" "http://$ROOT_IP:$PORT/" | tr -d '\r')
grep -qi '^proxy-authenticate: basic realm="proxyfleet"' <<<"$hdrs" && ok "407 asks for Basic realm=\"proxyfleet\"" || bad "407 headers: $hdrs"
grep -qiE '^server: squid$' <<<"$hdrs" && ok "Server: squid (no version)" || bad "Server header: $(grep -i '^server:' <<<"$hdrs")"
grep -qiE '^(via|x-cache|x-cache-lookup):' <<<"$hdrs" && bad "reply carries $(grep -iE '^(via|x-cache)' <<<"$hdrs")" || ok "no Via/X-Cache in squid's replies"
rhdrs=$(curl --noproxy '' -s --max-time 5 -o /dev/null -D - -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128" "http://$ROOT_IP:$PORT/" | tr -d '\r')
grep -qiE '^(via|x-cache|x-cache-lookup):' <<<"$rhdrs" && bad "proxied reply carries $(grep -iE '^(via|x-cache)' <<<"$rhdrs")" || ok "no Via/X-Cache in a proxied reply"
code=$(pcurl -p -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128")
[ "$code" = 200 ] && grep -q "^client: $IP$" "$DIR/body" && ok "CONNECT to $ROOT_IP:$PORT with the password: tunnel, 200 from the target" || bad "CONNECT with the password: $code"
cc=$(curl --noproxy '' -s --max-time 5 -o /dev/null -w '%{http_connect}' -p -x "http://$IP:3128" "http://$ROOT_IP:$PORT/")
[ "$cc" = 407 ] && ok "CONNECT without a password: 407" || bad "CONNECT without a password: $cc"
code=$(curl --noproxy '' -s --max-time 5 -o /dev/null -w '%{http_code}' -x "http://$PROXY_USER:$PROXY_PASS@$IP:3128" "http://127.0.0.1:3128/")
[ "$code" = 403 ] && ok "GET to the guest's own 127.0.0.1: 403" || bad "GET to 127.0.0.1 through the guest: $code"

# --- inside the guest, through guest-exec --------------------------------------
# gexec CMD: run sh -c CMD in the guest; prints its output and returns its exit code.
gexec() {
	local req pid st
	req=$(python3 -c 'import json,sys; print(json.dumps({"execute":"guest-exec","arguments":{"path":"/bin/sh","arg":["-c",sys.argv[1]],"capture-output":True}}))' "$1")
	pid=$(agent "$req" | python3 -c 'import json,sys; print(json.load(sys.stdin)["return"]["pid"])' 2>/dev/null) || return 99
	for _ in $(seq 120); do
		st=$(agent "{\"execute\":\"guest-exec-status\",\"arguments\":{\"pid\":$pid}}")
		if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["return"]["exited"] else 1)' "$st" 2>/dev/null; then
			python3 -c '
import base64, json, sys
r = json.loads(sys.argv[1])["return"]
sys.stdout.write(base64.b64decode(r.get("out-data", "")).decode(errors="replace"))
sys.stdout.write(base64.b64decode(r.get("err-data", "")).decode(errors="replace"))
sys.exit(r.get("exitcode", 0))' "$st"
			return
		fi
		sleep 0.5
	done
	return 98
}
gshow() { info "guest\$ $1"; gexec "$1" 2>&1 | sed 's/^/guest-smoke:   | /'; }
out=$(gexec 'cloud-init status --long')
rc=$?
sed 's/^/guest-smoke:   | /' <<<"$out"
[ "$rc" = 0 ] && grep -q '^status: done' <<<"$out" && ok "cloud-init status: done" || bad "cloud-init status (exit $rc)"
out=$(gexec 'squid -k parse 2>&1 | grep -E "ERROR|FATAL|WARNING|Bungled"; exit 0')
info "squid -k parse in the guest (errors and warnings):"; sed 's/^/guest-smoke:   | /' <<<"$out"
gexec 'squid -k parse >/dev/null 2>&1' && ok "squid -k parse accepts the seed's config" || bad "squid -k parse rejects the seed's config"
out=$(gexec 'systemctl is-enabled squid; systemctl is-active squid')
[ "$(tr '\n' ' ' <<<"$out")" = "enabled active " ] && ok "squid.service enabled and active" || bad "squid.service: $out"
gshow 'systemd-analyze; systemd-analyze blame | head -15'
gshow 'systemd-analyze critical-chain squid.service cloud-final.service 2>&1 | head -30'
gshow 'journalctl -b -o short-monotonic --no-pager -u squid -u cloud-final -u cloud-init -u cloud-init-local -u networking -u qemu-guest-agent 2>&1 | grep -E "Start|Finished|Started|squid|Accepting|Cloud-init" | head -40'
gshow 'cat /etc/network/interfaces.d/* 2>/dev/null; ip -4 -o addr show; cat /etc/resolv.conf; locale 2>&1 | head -2; df -h /; free -m'

net_active default && bad "libvirt's default network is active" || ok "default network inactive"
info "figures: lease ${t_lease:-?}s, agent ${t_agent:-?}s, hostname ${t_host:-?}s, port 3128 ${t_squid_any:-?}s, squid serving ${t_squid:-?}s (virsh start = 0)"
if [ "$fails" -gt 0 ]; then
	info "$fails check(s) failed; console log tail:"
	tail -30 "$CONSOLE_LOG"
	exit 1
fi
info "all checks passed"
