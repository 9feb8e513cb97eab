#!/bin/bash
# Tears down what up.sh set up: every domain on the test host's libvirtd and
# every volume in its pool, the pool, the network, the daemons, the namespace,
# the veth and the routes (VM network and egress blocks, IPv4 and IPv6), and
# .testhost state (the built guest is kept as a cache; pass --all to remove it
# too). Safe to run twice or after a crash.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
exec 9>/run/proxyfleet-testhost.lock
flock -w 900 9 || die "another up.sh/down.sh holds /run/proxyfleet-testhost.lock"
all=0
[ "${1:-}" = --all ] && all=1

if libvirt_up; then
	for d in $(virsh_ list --all --name); do
		log "removing domain $d"
		virsh_ destroy "$d" >/dev/null 2>&1
		virsh_ undefine "$d" --nvram --managed-save --snapshots-metadata --checkpoints-metadata >/dev/null 2>&1 ||
			virsh_ undefine "$d" >/dev/null 2>&1
	done
	if virsh_ pool-info "$POOL" >/dev/null 2>&1; then
		virsh_ pool-start "$POOL" >/dev/null 2>&1
		virsh_ pool-refresh "$POOL" >/dev/null 2>&1
		for v in $(virsh_ vol-list "$POOL" 2>/dev/null | awk '{print $1}'); do
			virsh_ vol-delete --pool "$POOL" "$v" >/dev/null 2>&1 || log "could not delete volume $v"
		done
		virsh_ pool-destroy "$POOL" >/dev/null 2>&1
		virsh_ pool-delete "$POOL" >/dev/null 2>&1
		virsh_ pool-undefine "$POOL" >/dev/null 2>&1
		log "removed pool $POOL"
	fi
	if virsh_ net-info "$NETWORK" >/dev/null 2>&1; then
		virsh_ net-destroy "$NETWORK" >/dev/null 2>&1
		virsh_ net-undefine "$NETWORK" >/dev/null 2>&1
		log "removed network $NETWORK"
	fi
else
	log "libvirtd is not answering: removing leftovers by hand"
	for f in /run/libvirt/qemu/*.pid; do
		[ -f "$f" ] || continue
		p=$(tr -dc 0-9 <"$f")
		[ -n "$p" ] && grep -q qemu "/proc/$p/comm" 2>/dev/null && kill -KILL "$p" 2>/dev/null
	done
	kill_pidfile "/run/libvirt/network/$NETWORK.pid" dnsmasq
	rm -f "/etc/libvirt/qemu/networks/$NETWORK.xml" "/etc/libvirt/qemu/networks/autostart/$NETWORK.xml" \
		"/run/libvirt/network/$NETWORK".* \
		"/etc/libvirt/storage/$POOL.xml" "/etc/libvirt/storage/autostart/$POOL.xml" "/run/libvirt/storage/$POOL.xml"
fi
kill_pidfile "/run/libvirt/network/$NETWORK.pid" dnsmasq

kill_pidfile "$STATE/run/sshd.pid" sshd
kill_pidfile /run/libvirtd.pid libvirtd
kill_pidfile /run/virtlogd.pid virtlogd

ip route del "$VM_NET" via "$NS_IP" 2>/dev/null
ip route del "$EGRESS4" via "$NS_IP" 2>/dev/null
ip -6 route del "$VM_NET6" via "$NS_IP6" 2>/dev/null
ip -6 route del "$EGRESS6" via "$NS_IP6" 2>/dev/null
ip link del "$VETH_ROOT" 2>/dev/null
if [ -e "/run/netns/$NS" ]; then
	# Anything still running in the namespace keeps it (and its links) alive.
	for p in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	ip netns del "$NS" 2>/dev/null || rm -f "/run/netns/$NS"
	log "removed netns $NS"
fi
rm -rf "${POOL_DIR:?}"
rmdir "$(dirname "$POOL_DIR")" 2>/dev/null
if [ "$all" = 1 ]; then
	rm -rf "${STATE:?}"
else
	find "$STATE" -mindepth 1 -maxdepth 1 ! -name guest -exec rm -rf {} + 2>/dev/null
fi
log "down"
exit 0
