#!/usr/bin/env bash
# make run: the local test host (a real libvirtd and sshd in a network
# namespace, tiny real VMs), then proxyfleet serve against it with the
# embedded NATS server, in the foreground. Run as root; `make testhost` ran
# just before (it is a prerequisite of `make run`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .testhost/env ] || { echo "no .testhost/env: run make testhost (as root)" >&2; exit 1; }
source .testhost/env
dir=$PWD/.run
mkdir -p "$dir/data"
cfg=$dir/config.yaml
# GUEST=debian (make run GUEST=debian): proxies boot the real Debian guest
# of make guest-image (cloud-init, qemu-guest-agent, squid; 512 MiB each,
# most of a minute to boot under TCG) instead of the tiny test guest.
guest=${GUEST:-test}
case $guest in
test) base() { cat "$PROXYFLEET_CONFIG"; } ;;
debian)
  [ -n "${TESTHOST_DEBIAN_IMAGE_YAML:-}" ] && [ -f "$TESTHOST_DEBIAN_IMAGE_YAML" ] ||
    { echo "GUEST=debian: no Debian guest image (make guest-image, then make testhost)" >&2; exit 1; }
  # The test host's config with the Debian image added (its entry of
  # .guest/image.yaml, without the "images:" line) and made the default.
  base() {
    sed -e "/^images:/r /dev/stdin" -e 's/^default_image: .*/default_image: proxy-debian/' \
      -e 's/^  memory_mib: .*/  memory_mib: 512/' "$PROXYFLEET_CONFIG" < <(grep -v '^images:' "$TESTHOST_DEBIAN_IMAGE_YAML")
  }
  ;;
*) echo "GUEST=$guest: want test or debian" >&2; exit 1 ;;
esac
# The gateway's one user, demo, with a password of its own made once.
gwpass=$dir/gateway-demo-password
[ -s "$gwpass" ] || { umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$gwpass"; }
# The console's one user, admin, with a password of its own made once.
conpass=$dir/console-admin-password
[ -s "$conpass" ] || { umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$conpass"; }
# The test host's config plus what a demo wants: fast health probing
# through every proxy into the health process's own /probe, served on the
# root namespace's address the guests reach, and the gateway.
{
  base
  cat <<YAML
worker: {poll_interval: 1s, observe_interval: 5s}
health: {http: "127.0.0.1:8090", probe_listen: "$TESTHOST_ROOT_IP:8081", interval: 2s, rise: 2, fall: 3, grace: 30s}
gateway:
  listen: "127.0.0.1:8888"
  socks_listen: "127.0.0.1:1080"
  users: [{name: demo, password_file: "$gwpass"}]
console:
  listen: "127.0.0.1:8080"
  users: [{name: admin, password_file: "$conpass", admin: true}]
  gateways: ["http://127.0.0.1:8090"]   # serve's gateway: its metrics are on health.http
YAML
} > "$cfg"
listen=${PROXYFLEET_LISTEN:-127.0.0.1:4222}
cat <<TXT

proxyfleet serve: embedded NATS on nats://$listen, health on http://127.0.0.1:8090, guest: $guest
gateway: http://127.0.0.1:8888 (HTTP proxy) and socks5://127.0.0.1:1080, user demo, password in $gwpass
console: http://127.0.0.1:8080 (web console), user admin, password in $conpass
host th1: libvirtd over ssh at $TESTHOST_SSH_ADDR (netns $TESTHOST_NETNS); its proxies take addresses of its plan: $TESTHOST_EGRESS_IPV4_CONFIG, $TESTHOST_EGRESS_IPV6_CONFIG (16 each)
config: $cfg

In another terminal (as root, from $PWD):
  bin/proxyfleet create p1 --wait          # boots a tiny VM (about 10 s), waits for its result
  bin/proxyfleet watch                     # a live table of proxies and states (Ctrl-C to leave)
  bin/proxyfleet rotation                  # the proxies clients may use now (after 2 passing probes)
  curl -s http://127.0.0.1:8090/rotation   # the same, from the health process
  curl -x http://$TESTHOST_PROXY_USER:\$(cat $TESTHOST_PROXY_PASSWORD_FILE)@\$(bin/proxyfleet rotation --json | sed -n 's/.*"addr": *"\\([^"]*\\)".*/\\1/p' | head -1) http://$TESTHOST_ROOT_IP:8081/probe?nonce=hello
                                           # a request through a proxy of the rotation, with the fleet's credential (proxy.auth)
  curl -x http://demo:\$(cat $gwpass)@127.0.0.1:8888 -i http://$TESTHOST_ROOT_IP:8081/probe?nonce=hello
                                           # the same through the gateway, which picks the proxy (X-Proxyfleet-Proxy says which)
  bin/proxyfleet delete p1 --wait

With the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):
  nats sub 'proxy.>' &
  nats pub proxy.cmd.create.p2 '{"v":1,"id":"p2"}' -H Nats-Msg-Id:my-cmd-1
  nats kv ls PROXY_ROTATION

Ctrl-C stops it (SIGTERM drains in-flight work first). make testhost-down removes the test host.
make run-sim runs the same with two simulated hosts instead, no VMs.

TXT
exec bin/proxyfleet serve --config "$cfg" --data-dir "$dir/data" --listen "$listen"
