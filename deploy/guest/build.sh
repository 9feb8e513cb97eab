#!/bin/bash
# Builds proxyfleet's Debian 12 proxy guest from Debian's own packages only
# (see README.md beside this file). Run as root; writes into $GUEST_DIR
# (default .guest/ at the repo root):
#   disk.qcow2        root filesystem (ext4, no partition table: root=/dev/vda)
#   vmlinuz           the image's kernel, for direct kernel boot
#   initrd.img        its initramfs (finds the virtio disk by itself)
#   *.sha256          their sha256 sums (hex only)
#   image.yaml        one proxyfleet `images:` entry (proxy-debian), file:// URLs
#   cmdline           the kernel command line (also in image.yaml)
#   kernel-version    the kernel's version (uname -r in the guest)
#   stamp             the hash of this build's inputs
# Cached: a rerun with the same inputs (this script's content, the package
# list, the suite, mirrors and disk size, the output path) does nothing. A
# changed input rebuilds. GUEST_FORCE=1 rebuilds anyway (e.g. to pick up
# Debian's newer package versions, which the stamp does not see).
# The build happens in temporary directories; the finished directory replaces
# $GUEST_DIR by rename, so an interrupted build leaves the old image or none,
# never a half one.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${GUEST_DIR:-$repo/.guest}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
out=${out%/}
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

SUITE=bookworm
# Debian's archive: the release, its stable updates and its security updates.
MIRROR=${GUEST_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${GUEST_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
DISK_SIZE=${GUEST_DISK_SIZE:-2G}   # the guest's root filesystem (virtual size; the qcow2 holds only what is used)
CMDLINE="root=/dev/vda rw console=ttyS0"

# What goes into the image on top of minbase (Priority: required), and why.
PKGS=(
	systemd-sysv             # an init: systemd (minbase has none)
	udev                     # device nodes and links: /dev/virtio-ports/org.qemu.guest_agent.0, which starts the agent
	linux-image-cloud-amd64  # Debian's kernel for VMs (virtio; far fewer modules than linux-image-amd64)
	initramfs-tools          # builds initrd.img (mounts root=/dev/vda)
	cloud-init               # reads the NoCloud seed: hostname, write_files, runcmd
	qemu-guest-agent         # libvirt's `domifaddr --source agent`, guest-exec, shutdown through the agent
	squid                    # the proxy (tinyproxy 1.11.1 answers 401, not 407, to a wrong password)
	ifupdown                 # cloud-init on Debian writes /etc/network/interfaces.d (eni); networking.service brings it up
	isc-dhcp-client          # dhclient: ifupdown's `inet dhcp` and cloud-init's ephemeral DHCP
	iproute2                 # ip: cloud-init and ifupdown configure links with it
	netbase                  # /etc/services, /etc/protocols, /etc/hosts
	ca-certificates          # trust store for https (apt, cloud-init fetching URLs)
	locales                  # update-locale: cloud-init's locale module fails without it
)
# dpkg leaves these out of every package: the image is uploaded to every host.
# The copyright files stay.
DPKG_OPTS=(
	'path-exclude=/usr/share/doc/*'
	'path-include=/usr/share/doc/*/copyright'
	'path-exclude=/usr/share/man/*'
	'path-exclude=/usr/share/info/*'
	'path-exclude=/usr/share/lintian/*'
	'path-exclude=/usr/share/linda/*'
	'path-exclude=/usr/share/locale/*'
	'path-include=/usr/share/locale/locale.alias'
	'path-exclude=/usr/share/i18n/locales/*'
	'path-include=/usr/share/i18n/locales/en_US'
	'path-include=/usr/share/i18n/locales/en_GB'
	'path-include=/usr/share/i18n/locales/i18n*'
	'path-include=/usr/share/i18n/locales/iso14651_t1*'
	'path-include=/usr/share/i18n/locales/translit_*'
	'path-exclude=/usr/share/squid/errors/*'
	'path-include=/usr/share/squid/errors/templates/*'
	'path-include=/usr/share/squid/errors/en*'
	'path-exclude=/usr/share/squid-langpack/*'
	'path-include=/usr/share/squid-langpack/templates/*'
	'path-include=/usr/share/squid-langpack/en*'
)

log() { echo "guest-image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap, chroot, device files)"
# The path goes into file:// URLs and YAML unquoted and unescaped.
[[ "$out" =~ ^[A-Za-z0-9._/+-]+$ ]] || die "GUEST_DIR $out: use only letters, digits and ._/+- in the path"

files=(disk.qcow2 vmlinuz initrd.img disk.qcow2.sha256 vmlinuz.sha256 initrd.img.sha256 image.yaml cmdline kernel-version)
stamp=$({
	sha256sum <"${BASH_SOURCE[0]}"
	printf '%s\n' "suite=$SUITE" "mirror=$MIRROR" "security=$SECURITY_MIRROR" "size=$DISK_SIZE" "out=$out" \
		"pkgs=${PKGS[*]}" "dpkg=${DPKG_OPTS[*]}"
} | sha256sum | cut -d' ' -f1)

cached() {
	[ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] || return 1
	local f
	for f in "${files[@]}"; do [ -s "$out/$f" ] || return 1; done
}
if [ -z "${GUEST_FORCE:-}" ] && cached; then
	log "cached in $out (stamp ${stamp:0:12}); GUEST_FORCE=1 rebuilds"
	exit 0
fi

# One build per output directory at a time.
key=$(printf %s "$out" | sha256sum | cut -c1-16)
mkdir -p /run/lock
exec 8>"/run/lock/proxyfleet-guest-$key.lock"
flock -w 1200 8 || die "another build of $out holds its lock"
if [ -z "${GUEST_FORCE:-}" ] && cached; then
	log "built meanwhile by another run: $out"
	exit 0
fi
t0=$(now_ms)

# Tools (Debian packages).
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v qemu-img >/dev/null || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q -o DPkg::Lock::Timeout=600
	apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${need[@]}"
fi

# remove_tree DIR: unmount what a killed mmdebstrap may have left mounted
# in DIR (its chroot's /proc, /sys, /dev), then remove it without crossing
# into any other file system.
remove_tree() {
	local m
	[ -e "$1" ] || return 0
	for m in $(findmnt -rn -o TARGET | grep -F "$1/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$1"
}
parent=$(dirname "$out")
mkdir -p "$parent"
tmpdir=${TMPDIR:-/var/tmp}
# Leftovers of an interrupted build of this directory (we hold its lock:
# nobody else uses them).
for d in "$out".new.* "$out".old.* "$tmpdir/proxyfleet-guest-$key".*; do remove_tree "$d"; done
new=$(mktemp -d "$out.new.XXXXXX")
stage=$(mktemp -d "$tmpdir/proxyfleet-guest-$key.XXXXXX")
trap 'remove_tree "$new"; remove_tree "$stage"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
root=$stage/root

# The image's own files, put in after the packages are installed (the
# customize hook gets the root directory as $1).
cat >"$stage/customize.sh" <<'HOOK'
#!/bin/bash
set -euo pipefail
r=$1
# cloud-init: only the NoCloud seed (no probing of cloud metadata services).
# C.UTF-8 is built into glibc: with it preset, cloud-init's locale module
# generates nothing at first boot (locale-gen of en_US.UTF-8 takes long under TCG).
# manage_etc_hosts: the host name (the seed's) resolves from /etc/hosts
# (127.0.1.1). squid looks its host name up at every start: through DNS
# that took 10 s each time on the test network (60 s for a restart).
# grub_dpkg: there is no grub (direct kernel boot); the module took 2.6 s.
cat >"$r/etc/cloud/cloud.cfg.d/90-proxyfleet.cfg" <<'EOF'
# proxyfleet: the seed is a NoCloud ISO (label cidata).
datasource_list: [ NoCloud, None ]
locale: C.UTF-8
manage_etc_hosts: localhost
grub_dpkg: {enabled: false}
EOF
echo 'LANG=C.UTF-8' >"$r/etc/default/locale"
# root=/dev/vda, no partition table.
printf '%s\n' '# <file system> <mount point> <type> <options> <dump> <pass>' \
	'/dev/vda / ext4 defaults,errors=remount-ro 0 1' >"$r/etc/fstab"
# mmdebstrap copied the build machine's; cloud-init and dhclient set them in the guest.
echo localhost >"$r/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
rm -f "$r/etc/resolv.conf"
# ifupdown: loopback here; cloud-init writes interfaces.d/50-cloud-init (DHCP on the NIC).
printf '%s\n' 'source /etc/network/interfaces.d/*' '' 'auto lo' 'iface lo inet loopback' >"$r/etc/network/interfaces"
# squid must never serve with Debian's packaged config (it allows localnet,
# 10/8 among them, without credentials). Its config here refuses everything,
# and squid starts only after cloud-init.service, whose write_files puts the
# proxy's own config in place first: so it serves with that config from its
# first start, 13-16 s sooner than from cloud-init's last stage (runcmd),
# and a guest whose seed configures nothing serves nobody.
cat >"$r/etc/squid/squid.conf" <<'EOF'
# proxyfleet guest image: refuses everything until the proxy's cloud-config
# (its seed's user-data) writes the real configuration over this file.
http_port 3128
http_access deny all
visible_hostname localhost
cache deny all
access_log none
EOF
mkdir -p "$r/etc/systemd/system/squid.service.d"
cat >"$r/etc/systemd/system/squid.service.d/proxyfleet.conf" <<'EOF'
# proxyfleet: start only once cloud-init has written the proxy's config.
[Unit]
After=cloud-init.service
EOF
chroot "$r" systemctl enable squid.service
[ "$(chroot "$r" systemctl is-enabled squid.service 2>/dev/null || true)" = enabled ] || { echo "squid.service is not enabled" >&2; exit 1; }
# Without the SysV script, `systemctl enable squid` (the cloud-config's)
# does not run systemd-sysv-install (update-rc.d, perl): 15 s under TCG.
# systemd uses squid.service either way.
chroot "$r" update-rc.d -f squid remove >/dev/null
rm -f "$r/etc/init.d/squid"
# Not for a proxy VM: e2scrub (ext4 on LVM; there is no LVM: its reaper took
# 17 s of the boot), apt's daily list refresh and upgrade (no background
# traffic from proxies; the image is rebuilt instead), gettys on tty2-6 (a VM
# without a screen; the serial console keeps its getty).
chroot "$r" systemctl disable e2scrub_reap.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer
chroot "$r" systemctl mask getty-static.service
# Nothing of the build in the image.
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
find "$r/var/log" -type f -delete
HOOK
chmod 755 "$stage/customize.sh"

dpkg_args=()
for o in "${DPKG_OPTS[@]}"; do dpkg_args+=("--dpkgopt=$o"); done
log "mmdebstrap $SUITE (${#PKGS[@]} packages on minbase)"
t=$(now_ms)
mmdebstrap --mode=root --variant=minbase --components=main --quiet \
	--include="$(IFS=,; echo "${PKGS[*]}")" \
	"${dpkg_args[@]}" \
	--aptopt='Acquire::Languages "none"' \
	--aptopt='Acquire::Retries "5"' \
	--customize-hook="$stage/customize.sh \"\$1\"" \
	"$SUITE" "$root" \
	"deb $MIRROR $SUITE main" \
	"deb $MIRROR $SUITE-updates main" \
	"deb $SECURITY_MIRROR $SUITE-security main"
log "mmdebstrap took $(( ($(now_ms) - t) / 1000 ))s"

# Kernel and initrd for direct kernel boot: exactly one of each.
kernels=("$root"/boot/vmlinuz-*)
if [ ${#kernels[@]} != 1 ] || [ ! -f "${kernels[0]}" ]; then die "want one /boot/vmlinuz-* in the image, have: ${kernels[*]}"; fi
kver=${kernels[0]##*/vmlinuz-}
[ -f "$root/boot/initrd.img-$kver" ] || die "no /boot/initrd.img-$kver in the image"
cp "$root/boot/vmlinuz-$kver" "$new/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$new/initrd.img"
# The guest boots them from outside; in /boot they would be 29 MiB of every
# upload that nothing reads (they do not compress). The kernel's modules and
# config stay; a kernel upgrade in the guest writes new ones.
rm -f "$root/boot/vmlinuz-$kver" "$root/boot/initrd.img-$kver"
for l in vmlinuz initrd.img vmlinuz.old initrd.img.old; do
	if [ -L "$root/$l" ] && [ ! -e "$root/$l" ]; then rm -f "$root/$l"; fi   # links to them
done

# The root filesystem: ext4 made from the directory, then qcow2 (compressed:
# the base image is only read, each proxy writes into its own overlay).
log "mkfs.ext4 ($DISK_SIZE) and qemu-img convert"
t=$(now_ms)
truncate -s "$DISK_SIZE" "$stage/disk.raw"
mkfs.ext4 -q -F -L proxyroot -m 1 -d "$root" "$stage/disk.raw"
rm -rf "$root"
qemu-img convert -q -c -f raw -O qcow2 "$stage/disk.raw" "$new/disk.qcow2"
rm -f "$stage/disk.raw"
log "filesystem and qcow2 took $(( ($(now_ms) - t) / 1000 ))s"

for f in disk.qcow2 vmlinuz initrd.img; do
	sha256sum "$new/$f" | cut -d' ' -f1 >"$new/$f.sha256"
done
sum() { cat "$new/$1.sha256"; }
cat >"$new/image.yaml" <<EOF
# proxyfleet image: Debian $SUITE with squid, cloud-init and qemu-guest-agent
# (deploy/guest/build.sh; kernel $kver). Paste into a config's images:.
images:
  - name: proxy-debian
    url: file://$out/disk.qcow2
    sha256: "$(sum disk.qcow2)"
    format: qcow2
    kernel: {url: "file://$out/vmlinuz", sha256: "$(sum vmlinuz)"}
    initrd: {url: "file://$out/initrd.img", sha256: "$(sum initrd.img)"}
    cmdline: "$CMDLINE"
EOF
echo "$kver" >"$new/kernel-version"
echo "$CMDLINE" >"$new/cmdline"
echo "$stamp" >"$new/stamp"
chmod 755 "$new"
chmod 644 "$new"/*

# Into place: the old directory aside, the new one in, the old one removed.
old=$out.old.$$
[ -e "$out" ] && mv -T "$out" "$old"
mv -T "$new" "$out"
rm -rf "$old"
trap 'remove_tree "$stage"' EXIT
log "kernel $kver; disk.qcow2 $(du -h --apparent-size "$out/disk.qcow2" | cut -f1), initrd $(du -h --apparent-size "$out/initrd.img" | cut -f1); written to $out"
log "build took $(( ($(now_ms) - t0) / 1000 ))s"
