package kvm

import (
	"strings"
	"testing"
)

const (
	testSHA  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testSHA2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
)

func TestName_perProxy(t *testing.T) {
	for _, id := range []string{"p1", "a", "base-h1-0123456789abcdef", "x-seed", "kernel-h-0123456789abcdef", strings.Repeat("a", 63)} {
		if got, ok := parseDomainName(domainName(id)); !ok || got != id {
			t.Errorf("domain of %q: parsed back as %q, %v", id, got, ok)
		}
		for _, c := range []struct {
			name string
			kind volumeKind
		}{{overlayVolumeName(id), kindOverlay}, {seedVolumeName(id), kindSeed}} {
			v, ok := parseVolumeName(c.name)
			if !ok || v.Kind != c.kind || v.ID != id {
				t.Errorf("%s volume of %q (%q): parsed back as %+v, %v", c.kind, id, c.name, v, ok)
			}
			if !isOurs(c.name) {
				t.Errorf("%q is not ours", c.name)
			}
		}
	}
	if got := domainName("p1"); got != "pf-p1" {
		t.Errorf("domainName = %q", got)
	}
	if got := overlayVolumeName("p1"); got != "pf-p1-disk.qcow2" {
		t.Errorf("overlayVolumeName = %q", got)
	}
	if got := seedVolumeName("p1"); got != "pf-p1-seed.iso" {
		t.Errorf("seedVolumeName = %q", got)
	}
}

func TestName_cached(t *testing.T) {
	base, err := baseVolumeName("beelink", strings.ToUpper(testSHA), "qcow2")
	if err != nil || base != "pf-base-beelink-0123456789abcdef.qcow2" {
		t.Fatalf("baseVolumeName = %q, %v", base, err)
	}
	v, ok := parseVolumeName(base)
	if !ok || v != (volumeName{Kind: kindBase, Host: "beelink", Digest: "0123456789abcdef", Format: "qcow2"}) {
		t.Fatalf("parsed %+v, %v", v, ok)
	}
	raw, _ := baseVolumeName("h-2-x", testSHA, "raw")
	if v, ok := parseVolumeName(raw); !ok || v.Host != "h-2-x" || v.Format != "raw" || v.Kind != kindBase {
		t.Fatalf("%q parsed %+v, %v", raw, v, ok)
	}
	k, err := kernelVolumeName("h1", testSHA)
	if err != nil || k != "pf-kernel-h1-0123456789abcdef" {
		t.Fatalf("kernelVolumeName = %q, %v", k, err)
	}
	if v, ok := parseVolumeName(k); !ok || v != (volumeName{Kind: kindKernel, Host: "h1", Digest: "0123456789abcdef"}) {
		t.Fatalf("parsed %+v, %v", v, ok)
	}
	i, err := initrdVolumeName("my-host-1", testSHA)
	if err != nil || i != "pf-initrd-my-host-1-0123456789abcdef" {
		t.Fatalf("initrdVolumeName = %q, %v", i, err)
	}
	if v, ok := parseVolumeName(i); !ok || v != (volumeName{Kind: kindInitrd, Host: "my-host-1", Digest: "0123456789abcdef"}) {
		t.Fatalf("parsed %+v, %v", v, ok)
	}
}

// Cached volumes are keyed by host entry and digest, never by image
// name alone. Two entries, or two digests, never share a name.
func TestName_cacheKeyedByHostEntryAndDigest(t *testing.T) {
	a, _ := baseVolumeName("h1", testSHA, "qcow2")
	b, _ := baseVolumeName("h2", testSHA, "qcow2")
	c, _ := baseVolumeName("h1", testSHA2, "qcow2")
	if a == b || a == c || b == c {
		t.Fatalf("names collide: %q %q %q", a, b, c)
	}
	ka, _ := kernelVolumeName("h1", testSHA)
	kb, _ := kernelVolumeName("h2", testSHA)
	ia, _ := initrdVolumeName("h1", testSHA)
	if ka == kb || ka == ia {
		t.Fatalf("names collide: %q %q %q", ka, kb, ia)
	}
}

// A proxy id may start with "base-": its overlay must never be named like a
// cached base image (the proxy's delete would remove the cache).
func TestName_overlayNeverCollidesWithCache(t *testing.T) {
	base, _ := baseVolumeName("h1", testSHA, "qcow2")
	id := strings.TrimSuffix(strings.TrimPrefix(base, namePrefix), ".qcow2") // "base-h1-0123456789abcdef"
	if overlayVolumeName(id) == base || seedVolumeName(id) == base {
		t.Fatalf("proxy %q's volumes are named like the base %q", id, base)
	}
	if v, _ := parseVolumeName(overlayVolumeName(id)); v.Kind != kindOverlay {
		t.Fatalf("overlay of %q parsed as %v", id, v.Kind)
	}
	kernel, _ := kernelVolumeName("h1", testSHA)
	kid := strings.TrimPrefix(kernel, namePrefix)
	for _, n := range []string{overlayVolumeName(kid), seedVolumeName(kid)} {
		if n == kernel {
			t.Fatalf("proxy %q's volume is named like the kernel %q", kid, kernel)
		}
		if v, _ := parseVolumeName(n); v.Kind == kindKernel {
			t.Fatalf("%q parsed as a kernel", n)
		}
	}
}

func TestName_notOurs(t *testing.T) {
	for _, n := range []string{
		"", "p1", "debian-12.qcow2", "pf-", "pf-.qcow2", "pf--disk.qcow2", "pf-P1-disk.qcow2",
		"pf-p1.qcow2", // the shape of no kind
		"pf-base-h1-0123456789abcdef.vmdk", "pf-base-h1-0123456789abcde.qcow2", "pf-base-h1-0123456789abcdeg.qcow2",
		"pf-base-0123456789abcdef.qcow2", "pf-kernel-h1", "pf-kernel--0123456789abcdef",
		"pf-initrd-h1_0123456789abcdef", "pf-../etc-disk.qcow2", "pf-a/b-seed.iso",
		// Shorter than the prefix and suffix together: a sweep listing
		// someone else's volume must not panic (found by FuzzDomainXML).
		"pf-seed.iso", "pf-disk.qcow2",
	} {
		if v, ok := parseVolumeName(n); ok {
			t.Errorf("volume %q parsed as ours: %+v", n, v)
		}
	}
	for _, n := range []string{"", "p1", "pf-", "pf-P1", "pf-p1.qcow2", "pf--x", "pf-x-", "web-1"} {
		if id, ok := parseDomainName(n); ok {
			t.Errorf("domain %q parsed as ours: %q", n, id)
		}
	}
	if isOurs("web-1") || !isOurs("pf-whatever") {
		t.Error("isOurs is wrong about the prefix")
	}
}

func TestName_badInputs(t *testing.T) {
	if _, err := baseVolumeName("h1", testSHA[:16], "qcow2"); err == nil {
		t.Error("a 16-digit sha256 was accepted")
	}
	if _, err := baseVolumeName("h1", strings.Repeat("z", 64), "qcow2"); err == nil {
		t.Error("a non-hex sha256 was accepted")
	}
	if _, err := baseVolumeName("H1", testSHA, "qcow2"); err == nil {
		t.Error("an invalid host entry was accepted")
	}
	if _, err := baseVolumeName("h1", testSHA, "vmdk"); err == nil {
		t.Error("format vmdk was accepted")
	}
	if _, err := kernelVolumeName("h/1", testSHA); err == nil {
		t.Error("a host entry with a slash was accepted")
	}
}
