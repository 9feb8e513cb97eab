#!/bin/bash
# Builds the test guest under $TESTHOST_DIR/guest (default .testhost/guest):
#   vmlinuz     Debian's kernel (direct kernel boot)
#   initrd.img  busybox + the testguest program as /init + virtio modules (cpio newc, gzip)
#   disk.raw    1 MiB of zeros (the provider backs each proxy's overlay with it)
#   *.sha256    their sha256 sums (hex only)
# Needs linux-image-amd64 and busybox-static (up.sh installs them) and Go.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${TESTHOST_DIR:-$repo/.testhost}
out=$state/guest
[ -x /usr/local/go/bin/go ] && case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) PATH=$PATH:/usr/local/go/bin ;; esac

log() { echo "build-guest: $*" >&2; }

# Kernel: the newest /boot/vmlinuz-* that has its modules installed.
kver=${TESTGUEST_KERNEL_VERSION:-}
if [ -z "$kver" ]; then
	for k in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -V -r); do
		if [ -d "/lib/modules/$k" ]; then kver=$k; break; fi
	done
fi
[ -n "$kver" ] || { log "no /boot/vmlinuz-* with /lib/modules/<version> (install linux-image-amd64)"; exit 1; }
moddir=/lib/modules/$kver
busybox=/bin/busybox
[ -x "$busybox" ] || { log "no $busybox (install busybox-static)"; exit 1; }
grep -qx udhcpc <<<"$("$busybox" --list)" || { log "$busybox has no udhcpc"; exit 1; }

# Module load order (TESTHOST.md for virtio net; virtio_console for the agent
# channel; virtio_blk, cdrom, isofs for the seed; fat/vfat for a vfat seed;
# virtio_scsi + sr_mod for a seed CD-ROM on virtio-scsi. No ATA: probing the
# IDE controller adds ~0.7 s to every boot under TCG).
modules=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
	failover net_failover virtio_net virtio_console virtio_blk cdrom isofs
	nls_cp437 nls_ascii fat vfat scsi_common scsi_mod virtio_scsi sr_mod)

stage=$(mktemp -d "${TMPDIR:-/tmp}/testguest-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,etc/testguest,lib/modules,proc,sys,dev,run,tmp,mnt,root}

# The program.
log "building testguest (CGO_ENABLED=0)"
(cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags='-s -w' -o "$stage/init" ./testguest)

# busybox with a link per applet (sh, ip, udhcpc, mount, ...).
cp "$busybox" "$stage/bin/busybox"
for a in $("$busybox" --list); do
	[ "$a" = busybox ] && continue
	[ -e "$stage/bin/$a" ] || ln -s busybox "$stage/bin/$a"
done

# Modules: copy (decompressing) each one present; a module that is built in is skipped.
: >"$stage/etc/testguest/modules"
declare -A have=()
for m in "${modules[@]}"; do
	rel=$(awk -F: -v m="$m" '{n=$1; sub(/.*\//,"",n); sub(/\.ko(\.(xz|zst|gz))?$/,"",n); gsub(/-/,"_",n); if (n==m) {print $1; exit}}' "$moddir/modules.dep")
	if [ -z "$rel" ]; then
		if grep -Eq "/$m\.ko$" "$moddir/modules.builtin" 2>/dev/null; then
			log "module $m is built in"
		else
			log "module $m not found in $moddir (skipped)"
		fi
		continue
	fi
	# Each dependency must come earlier in the list (or be built in).
	for dep in $(awk -F: -v r="$rel" '$1==r {print $2}' "$moddir/modules.dep"); do
		d=${dep##*/}; d=${d%%.ko*}; d=${d//-/_}
		[ -n "${have[$d]:-}" ] || { log "module $m needs $d earlier in the list"; exit 1; }
	done
	src=$moddir/$rel
	dst=$stage/lib/modules/$m.ko
	case "$src" in
	*.ko.xz) xz -dc "$src" >"$dst" ;;
	*.ko.zst) zstd -qdc "$src" >"$dst" ;;
	*.ko.gz) gzip -dc "$src" >"$dst" ;;
	*) cp "$src" "$dst" ;;
	esac
	have[$m]=1
	echo "$m" >>"$stage/etc/testguest/modules"
done

# udhcpc's script: it has no default script in a bare initramfs.
cat >"$stage/etc/udhcpc.script" <<'EOF'
#!/bin/sh
# udhcpc event script: $1 is the event; $interface, $ip, $subnet, $router, $dns set.
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set "$interface" up
	;;
bound|renew)
	ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}" up
	ip route del default 2>/dev/null
	for r in $router; do ip route add default via "$r" dev "$interface" && break; done
	: >/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	echo "udhcpc: $1 $interface $ip/${mask:-?} via ${router:-none} lease ${lease:-?}s" >/dev/console
	;;
esac
exit 0
EOF
chmod 755 "$stage/etc/udhcpc.script"
echo "root:x:0:0:root:/root:/bin/sh" >"$stage/etc/passwd"
echo "root:x:0:" >"$stage/etc/group"
echo testguest >"$stage/etc/hostname"
# /dev/console before devtmpfs is mounted (the kernel opens it for /init).
mknod -m 600 "$stage/dev/console" c 5 1 2>/dev/null || true

# Fixed timestamps so the same inputs give the same initrd (and sha256).
find "$stage" -exec touch -h -d @0 {} +

mkdir -p "$out"
tmp=$out/.initrd.img.tmp
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible 2>/dev/null | gzip -9n >"$tmp") ||
	(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null | gzip -9n >"$tmp")
mv -f "$tmp" "$out/initrd.img"
cp "/boot/vmlinuz-$kver" "$out/.vmlinuz.tmp" && mv -f "$out/.vmlinuz.tmp" "$out/vmlinuz"
if [ ! -s "$out/disk.raw" ] || [ "$(stat -c %s "$out/disk.raw")" != 1048576 ]; then
	head -c 1048576 /dev/zero >"$out/disk.raw"
fi
for f in vmlinuz initrd.img disk.raw; do
	sha256sum "$out/$f" | cut -d' ' -f1 >"$out/$f.sha256"
done
echo "$kver" >"$out/kernel-version"
chmod 644 "$out"/vmlinuz "$out"/initrd.img "$out"/disk.raw
log "kernel $kver; $(du -h "$out/initrd.img" | cut -f1) initrd with $(wc -l <"$stage/etc/testguest/modules") modules; written to $out"
