#!/bin/bash
# Builds the Debian 12 root that deploy/systemd_boot_test.go boots with
# `systemd-nspawn -b` (systemd as PID 1) to install and run the shipped units
# as an operator would. Run as root; writes $NSPAWN_DIR (default .nspawn/ at
# the repo root):
#   root/    the root file system (minbase, systemd, curl, openssl)
#   stamp    the hash of this build's inputs
# The tests never write into root/: they boot it with --volatile=overlay (a
# tmpfs over it that goes with the container).
# Cached: a rerun with the same inputs (this script's content, the package
# list, the suite, the mirrors) does nothing; a changed input
# rebuilds; NSPAWN_FORCE=1 rebuilds anyway. The build happens in a temporary
# directory that replaces $NSPAWN_DIR by rename: an interrupted build leaves
# the old root or none, never a half one, and the next run removes what it
# left (mounts included). Built the way deploy/guest/build.sh builds the
# proxy guest.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${NSPAWN_DIR:-$repo/.nspawn}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
out=${out%/}
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

SUITE=bookworm
MIRROR=${GUEST_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${GUEST_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# On top of minbase, and why.
PKGS=(
	systemd-sysv   # systemd as init, systemctl, journalctl, systemd-sysusers
	curl           # the operator's check of /healthz and /readyz (docs/OPERATIONS.md)
	openssl        # the operator's `openssl rand` for the passwords (docs/OPERATIONS.md)
)
DPKG_OPTS=(
	'path-exclude=/usr/share/doc/*'
	'path-include=/usr/share/doc/*/copyright'
	'path-exclude=/usr/share/man/*'
	'path-exclude=/usr/share/info/*'
	'path-exclude=/usr/share/locale/*'
)

log() { echo "nspawn-root: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap, chroot, device files)"

stamp=$({
	sha256sum <"${BASH_SOURCE[0]}"
	printf '%s\n' "suite=$SUITE" "mirror=$MIRROR" "security=$SECURITY_MIRROR" \
		"pkgs=${PKGS[*]}" "dpkg=${DPKG_OPTS[*]}"
} | sha256sum | cut -d' ' -f1)

cached() {
	[ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/root/lib/systemd/systemd" ]
}
if [ -z "${NSPAWN_FORCE:-}" ] && cached; then
	log "cached in $out (stamp ${stamp:0:12}); NSPAWN_FORCE=1 rebuilds"
	exit 0
fi

# One build per output directory at a time.
key=$(printf %s "$out" | sha256sum | cut -c1-16)
mkdir -p /run/lock
exec 8>"/run/lock/proxyfleet-nspawn-$key.lock"
flock -w 600 8 || die "another build of $out holds its lock"
if [ -z "${NSPAWN_FORCE:-}" ] && cached; then
	log "built meanwhile by another run: $out"
	exit 0
fi
t0=$(now_ms)

command -v mmdebstrap >/dev/null || {
	log "installing mmdebstrap"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q -o DPkg::Lock::Timeout=600
	apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 mmdebstrap
}

# remove_tree DIR: unmount what a killed mmdebstrap may have left mounted in
# DIR (its chroot's /proc, /sys, /dev), then remove it without crossing into
# any other file system.
remove_tree() {
	local m
	[ -e "$1" ] || return 0
	for m in $(findmnt -rn -o TARGET | grep -F "$1/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$1"
}
mkdir -p "$(dirname "$out")"
# Leftovers of an interrupted build (we hold the lock: nobody else uses them).
for d in "$out".new.* "$out".old.*; do remove_tree "$d"; done
new=$(mktemp -d "$out.new.XXXXXX")
trap 'remove_tree "$new"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What the root needs to boot under systemd-nspawn quickly and quietly: no
# host name or resolver of the build machine, no getty on a console nobody
# reads, no timers that would reach the network.
cat >"$new/customize.sh" <<'HOOK'
#!/bin/bash
set -euo pipefail
r=$1
echo proxyfleet-test >"$r/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
rm -f "$r/etc/resolv.conf"
: >"$r/etc/machine-id"   # systemd makes one at boot (nspawn passes the container's)
chroot "$r" systemctl mask console-getty.service getty@.service systemd-timesyncd.service \
	apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer 2>/dev/null || true
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin
find "$r/var/log" -type f -delete
HOOK
chmod 755 "$new/customize.sh"

dpkg_args=()
for o in "${DPKG_OPTS[@]}"; do dpkg_args+=("--dpkgopt=$o"); done
log "mmdebstrap $SUITE (${PKGS[*]} on minbase)"
mmdebstrap --mode=root --variant=minbase --components=main --quiet \
	--include="$(IFS=,; echo "${PKGS[*]}")" \
	"${dpkg_args[@]}" \
	--aptopt='Acquire::Languages "none"' \
	--aptopt='Acquire::Retries "5"' \
	--customize-hook="$new/customize.sh \"\$1\"" \
	"$SUITE" "$new/root" \
	"deb $MIRROR $SUITE main" \
	"deb $MIRROR $SUITE-updates main" \
	"deb $SECURITY_MIRROR $SUITE-security main"
rm -f "$new/customize.sh"
echo "$stamp" >"$new/stamp"
chmod 755 "$new"

# Into place: the old directory aside, the new one in, the old one removed.
old=$out.old.$$
[ -e "$out" ] && mv -T "$out" "$old"
mv -T "$new" "$out"
trap - EXIT
remove_tree "$old"
log "$(du -sh "$out/root" | cut -f1) in $out/root; build took $(( ($(now_ms) - t0) / 1000 ))s"
