package kvm

import (
	"fmt"
	"strings"

	"proxyfleet/messages"
)

// Names of everything the provider makes on a host.
//
// The provider keeps no per-instance state (DESIGN.md, semantics 6), so every
// domain and volume it creates must be findable again from its name alone:
// a sweep lists a host's domains and a pool's volumes and must tell, for each
// name, whether it is ours, what kind of thing it is and which proxy (or
// which cached artifact) it belongs to. The names are therefore deterministic
// functions of the proxy id, or of the host entry and the artifact's digest,
// and each kind has a shape that no other kind can take:
//
//	domain    pf-<id>
//	overlay   pf-<id>-disk.qcow2
//	seed      pf-<id>-seed.iso
//	base      pf-base-<host>-<digest16>.<format>
//	kernel    pf-kernel-<host>-<digest16>
//	initrd    pf-initrd-<host>-<digest16>
//
// Ids and host entries match ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$, so they
// never contain '.', '_' or '/'; digest16 is the first 16 lowercase hex digits
// of the artifact's sha256.
//
// Why the overlay is "pf-<id>-disk.qcow2" and not "pf-<id>.qcow2": a proxy
// id may itself start with "base-". The proxy "base-h1-0123456789abcdef"
// would then own the overlay "pf-base-h1-0123456789abcdef.qcow2", the very
// name of host entry h1's cached qcow2 base image with that digest: a
// client could make a create fail on it, and the failed create's clean-up,
// or the proxy's delete, would remove the cache. With the "-disk" suffix the
// two shapes cannot meet: a base name has a hex digit before ".qcow2", an
// overlay name has the 'k' of "disk". Kernel and initrd names have no
// extension and every per-proxy volume has one, so those cannot meet either.
// Domain names live in libvirt's domain namespace, apart from volumes, which
// is why domain and volume names are parsed by separate functions: the
// domain of proxy "kernel-h1-0123456789abcdef" is "pf-kernel-h1-0123456789abcdef",
// which as a volume name would be a kernel.
//
// Base, kernel and initrd names are keyed by host entry AND digest: two
// host entries may point at one libvirt pool, and a name
// from the image name alone would let one entry use a volume another entry
// uploaded, or verified, differently.
const (
	namePrefix   = "pf-"
	overlaySufx  = "-disk.qcow2"
	seedSufx     = "-seed.iso"
	basePrefix   = namePrefix + "base-"
	kernelPrefix = namePrefix + "kernel-"
	initrdPrefix = namePrefix + "initrd-"
	// digestLen is how much of a sha256 goes into a cached volume's name:
	// 64 bits, plenty to tell images apart on one host, short enough to read.
	digestLen = 16
)

// volumeKind is what a pool volume of ours holds.
type volumeKind int

const (
	kindNone    volumeKind = iota
	kindOverlay            // a proxy's qcow2 disk on top of a base image
	kindSeed               // a proxy's NoCloud seed ISO
	kindBase               // a cached base image
	kindKernel             // a cached kernel for direct kernel boot
	kindInitrd             // a cached initrd for direct kernel boot
)

func (k volumeKind) String() string {
	switch k {
	case kindOverlay:
		return "overlay"
	case kindSeed:
		return "seed"
	case kindBase:
		return "base"
	case kindKernel:
		return "kernel"
	case kindInitrd:
		return "initrd"
	}
	return "none"
}

// volumeName is a pool volume name of ours, parsed. ID is set for the
// per-proxy kinds (overlay, seed); Host and Digest for the cached kinds
// (base, kernel, initrd); Format for base images only.
type volumeName struct {
	Kind   volumeKind
	ID     string
	Host   string
	Digest string
	Format string
}

// isOurs reports whether a domain or volume name is in proxyfleet's
// namespace. It says nothing about the kind; use parseDomainName or
// parseVolumeName for that.
func isOurs(name string) bool { return strings.HasPrefix(name, namePrefix) }

// domainName is the libvirt domain name of proxy id. The id must be valid
// (messages.ValidID); domainXML checks it before it reaches libvirt.
func domainName(id string) string { return namePrefix + id }

// overlayVolumeName is the pool volume holding proxy id's disk.
func overlayVolumeName(id string) string { return namePrefix + id + overlaySufx }

// seedVolumeName is the pool volume holding proxy id's NoCloud seed ISO.
func seedVolumeName(id string) string { return namePrefix + id + seedSufx }

// baseVolumeName is the cached base image of host entry host for the image
// with sha256 digest sha (hex) in format (qcow2 or raw).
func baseVolumeName(host, sha, format string) (string, error) {
	d, err := digest16(sha)
	if err != nil {
		return "", err
	}
	if err := checkHostEntry(host); err != nil {
		return "", err
	}
	if format != "qcow2" && format != "raw" {
		return "", fmt.Errorf("base volume: format %q is not qcow2 or raw", format)
	}
	return basePrefix + host + "-" + d + "." + format, nil
}

// kernelVolumeName is the cached kernel of host entry host with sha256 sha.
func kernelVolumeName(host, sha string) (string, error) {
	return artifactName(kernelPrefix, host, sha)
}

// initrdVolumeName is the cached initrd of host entry host with sha256 sha.
func initrdVolumeName(host, sha string) (string, error) {
	return artifactName(initrdPrefix, host, sha)
}

func artifactName(prefix, host, sha string) (string, error) {
	d, err := digest16(sha)
	if err != nil {
		return "", err
	}
	if err := checkHostEntry(host); err != nil {
		return "", err
	}
	return prefix + host + "-" + d, nil
}

// digest16 returns the first 16 hex digits of a sha256, lowercased. It wants
// the whole digest, so that a truncated or mistyped one is caught here
// rather than silently naming a different cache entry.
func digest16(sha string) (string, error) {
	s := strings.ToLower(sha)
	if len(s) != 64 || !isHex(s) {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits", sha)
	}
	return s[:digestLen], nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func checkID(id string) error {
	if !messages.ValidID(id) {
		return fmt.Errorf("proxy id %q is not valid", id)
	}
	return nil
}

func checkHostEntry(host string) error {
	if !messages.ValidID(host) {
		return fmt.Errorf("host entry %q is not valid", host)
	}
	return nil
}

// parseDomainName returns the proxy id of one of our domains, and false for
// any domain that is not ours (no "pf-" prefix, or not a valid id after it).
func parseDomainName(name string) (id string, ok bool) {
	id, ok = strings.CutPrefix(name, namePrefix)
	if !ok || !messages.ValidID(id) {
		return "", false
	}
	return id, true
}

// parseVolumeName parses a pool volume name. ok is false for a volume that
// is not ours or that has a shape none of our kinds has (someone else's
// "pf-something", which a sweep must leave alone).
func parseVolumeName(name string) (v volumeName, ok bool) {
	if !isOurs(name) {
		return volumeName{}, false
	}
	// Per-proxy kinds first: their suffixes cannot end a cached name (see
	// the comment on the name constants), so the order is only for clarity.
	// The prefix is cut again from what is left without the suffix: in
	// "pf-seed.iso" the two overlap, and no id is left.
	if rest, ok := strings.CutSuffix(name, overlaySufx); ok {
		if id, ok := strings.CutPrefix(rest, namePrefix); ok && messages.ValidID(id) {
			return volumeName{Kind: kindOverlay, ID: id}, true
		}
		return volumeName{}, false
	}
	if rest, ok := strings.CutSuffix(name, seedSufx); ok {
		if id, ok := strings.CutPrefix(rest, namePrefix); ok && messages.ValidID(id) {
			return volumeName{Kind: kindSeed, ID: id}, true
		}
		return volumeName{}, false
	}
	if rest, ok := strings.CutPrefix(name, basePrefix); ok {
		stem, format, found := strings.Cut(rest, ".")
		if !found || (format != "qcow2" && format != "raw") {
			return volumeName{}, false
		}
		host, d, ok := splitHostDigest(stem)
		if !ok {
			return volumeName{}, false
		}
		return volumeName{Kind: kindBase, Host: host, Digest: d, Format: format}, true
	}
	for _, k := range []struct {
		prefix string
		kind   volumeKind
	}{{kernelPrefix, kindKernel}, {initrdPrefix, kindInitrd}} {
		if rest, ok := strings.CutPrefix(name, k.prefix); ok {
			host, d, ok := splitHostDigest(rest)
			if !ok {
				return volumeName{}, false
			}
			return volumeName{Kind: k.kind, Host: host, Digest: d}, true
		}
	}
	return volumeName{}, false
}

// splitHostDigest splits "<host>-<digest16>"; the digest has a fixed length,
// so a host entry with dashes in it is no ambiguity.
func splitHostDigest(s string) (host, digest string, ok bool) {
	if len(s) < digestLen+2 || s[len(s)-digestLen-1] != '-' {
		return "", "", false
	}
	host, digest = s[:len(s)-digestLen-1], s[len(s)-digestLen:]
	if !messages.ValidID(host) || !isHex(digest) {
		return "", "", false
	}
	return host, digest, true
}
