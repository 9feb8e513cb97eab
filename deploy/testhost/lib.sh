# Shared settings and helpers for the test host scripts (sourced, not run).
# shellcheck disable=SC2034  # settings used by the scripts that source this file
# shellcheck shell=bash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${TESTHOST_DIR:-$repo/.testhost}
NS=${TESTHOST_NETNS:-pftest}
VETH_ROOT=${TESTHOST_VETH:-${NS:0:12}-r}
VETH_NS=${VETH_ROOT%-r}-n
ROOT_IP=198.18.0.1
NS_IP=198.18.0.2
BRIDGE=${TESTHOST_BRIDGE:-pfbr0}
BRIDGE_IP=198.18.100.1
VM_NET=198.18.100.0/24
# IPv6 (documentation prefix 2001:db8::/32 only): the veth pair's /64, the
# VM network's /64 (the bridge's address is the guests' IPv6 gateway).
ROOT_IP6=2001:db8:0:1::1
NS_IP6=2001:db8:0:1::2
BRIDGE_IP6=2001:db8:100::1
VM_NET6=2001:db8:100::/64
# Egress blocks for address plans: routed to the bridge in the namespace and
# to the namespace in the root namespace. Guests take /32s and /128s from
# them with an on-link default route via BRIDGE_IP / BRIDGE_IP6. The lower
# halves are the generated config's (host th1 in proxyfleet.yaml), the
# upper halves are in no generated config: tests' own plans take them.
EGRESS4=198.18.101.0/24
EGRESS4_CONFIG=198.18.101.0/25
EGRESS4_FREE=198.18.101.128/25
EGRESS6=2001:db8:101::/64
EGRESS6_CONFIG=2001:db8:101::/65
EGRESS6_FREE=2001:db8:101:0:8000::/65
POOL=${TESTHOST_POOL:-pftest}
POOL_DIR=${TESTHOST_POOL_DIR:-/var/lib/proxyfleet-testhost/pool}
NETWORK=${TESTHOST_NETWORK:-pftest}
URI=qemu:///system
PKGS=(libxml2-utils libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
	qemu-utils openssh-server dnsmasq-base genisoimage busybox-static linux-image-amd64
	iproute2 curl
	iptables           # ip6tables: no router advertisements on the VM network (up.sh)
	systemd            # systemd-analyze and systemd-sysusers: deploy/systemd_test.go checks the units
	systemd-container  # systemd-nspawn: deploy/systemd_boot_test.go boots the units under systemd
	mmdebstrap         # deploy/nspawn/build.sh: the Debian root it boots (and deploy/guest/build.sh)
	podman runc        # deploy/image_run_test.go builds the image (make image-local) and runs it
	chromium)          # console/browser_test.go drives the web console in headless Chromium

export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
[ -x /usr/local/go/bin/go ] && case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) PATH=$PATH:/usr/local/go/bin ;; esac

_t0=$(date +%s%3N)
log() { local d=$(($(date +%s%3N) - _t0)); printf 'testhost: [%d.%03ds] %s\n' $((d / 1000)) $((d % 1000)) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

virsh_() { virsh -q -c "$URI" "$@"; }

# ns_inode prints the inode of a network namespace file.
ns_inode() { stat -Lc %i "$1" 2>/dev/null; }

# pid_alive PID NAME: the process exists, is not a zombie (nothing reaps
# orphans on a machine without an init system) and its comm is NAME.
pid_alive() {
	local pid=$1 name=$2 stat
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ] || return 1
	[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}

# pid_in_ns PID: the process is in our network namespace.
pid_in_ns() {
	local want
	want=$(ns_inode "/run/netns/$NS") || return 1
	[ -n "$want" ] && [ "$(ns_inode "/proc/$1/ns/net")" = "$want" ]
}

# logs_here PID NAME: the daemon logs into this checkout's state directory.
# One started by another checkout logs into a directory that may be gone,
# and libvirtd then fails every child process it starts (qemu-img exits
# 125: "failed to open …/libvirtd.log: No such file or directory").
logs_here() {
	tr '\0' '\n' 2>/dev/null </proc/"$1"/environ | grep -qxF "LIBVIRT_LOG_OUTPUTS=3:file:$STATE/logs/$2.log"
}

# kill_pidfile FILE NAME: stop the process named NAME whose pid is in FILE
# (TERM, then KILL after 5 s) and remove the file.
kill_pidfile() {
	local f=$1 name=$2 pid i
	[ -f "$f" ] || return 0
	pid=$(tr -dc 0-9 <"$f")
	if pid_alive "$pid" "$name"; then
		log "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 50); do pid_alive "$pid" "$name" || break; sleep 0.1; done
		if pid_alive "$pid" "$name"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
	fi
	rm -f "$f"
}

# wait_until SECONDS CMD...: poll CMD every 0.2 s until it succeeds.
wait_until() {
	local secs=$1; shift
	local end=$(($(date +%s) + secs))
	while ! "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$end" ] || return 1
		sleep 0.2
	done
}

libvirt_up() { timeout 5 virsh -c "$URI" version >/dev/null 2>&1; }

# net_active NAME: the libvirt network is active. (Output is captured rather
# than piped into grep -q, which would SIGPIPE virsh under pipefail.)
net_active() { grep -q '^Active:.*yes' <<<"$(virsh_ net-info "$1" 2>/dev/null)"; }
