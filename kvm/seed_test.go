package kvm

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
)

func TestSeed_readsBack(t *testing.T) {
	ud := "#cloud-config\nhostname: pf-p1\nruncmd:\n  - [\"echo\", \"<&>\"]\n"
	img, err := seedISO("p1-3f2a9c", "pf-p1", ud)
	if err != nil {
		t.Fatal(err)
	}
	if len(img) < 32774 || string(img[32769:32774]) != "CD001" {
		t.Fatalf("no ISO9660 magic at 32769")
	}
	if len(img)%2048 != 0 {
		t.Fatalf("image of %d bytes is not whole sectors", len(img))
	}
	files := readISO(t, img)
	if got := files["meta-data"]; got != "instance-id: \"p1-3f2a9c\"\nlocal-hostname: \"pf-p1\"\n" {
		t.Fatalf("meta-data %q", got)
	}
	if got := files["user-data"]; got != ud {
		t.Fatalf("user-data %q", got)
	}
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
}

// What the guest sees: the library writes no Rock Ridge or Joliet, so the
// names in the directory records are what Linux's isofs shows after mapping
// them to lower case and dropping ";1". They must come out as "meta-data"
// and "user-data", the names cloud-init reads (the test guest would also
// take "meta_data").
func TestSeed_namesAsTheGuestSeesThem(t *testing.T) {
	img, err := seedISO("i-1", "pf-p1", "#cloud-config\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, stored := range []string{"meta-data;1", "user-data;1"} {
		if !bytes.Contains(img, []byte(stored)) {
			t.Errorf("no directory record %q in the image", stored)
		}
		seen := strings.TrimSuffix(strings.ToLower(stored), ";1") // isofs, map=normal
		if seen != "meta-data" && seen != "user-data" {
			t.Errorf("the guest would see %q", seen)
		}
	}
}

func TestSeed_rejectsValuesThatWouldBreakMetaData(t *testing.T) {
	for _, c := range []struct{ id, host string }{
		{"", "pf-p1"},
		{"p1\nlocal-hostname: evil", "pf-p1"},
		{"p1 #", "pf-p1"},
		{"p1", ""},
		{"p1", "PF-P1"},
		{"p1", "pf-p1\ninstance-id: x"},
		{"p1", "pf_p1"},
		{"p1", strings.Repeat("a.", 127) + "a"},
	} {
		if _, err := seedISO(c.id, c.host, ""); err == nil {
			t.Errorf("seedISO(%q, %q) accepted", c.id, c.host)
		}
	}
	if _, err := seedISO("p1.2_x-Y", "pf-p1.fleet.example", ""); err != nil {
		t.Errorf("good values refused: %v", err)
	}
}

func TestUserData(t *testing.T) {
	got, err := userData("", "p1", "pf-p1")
	if err != nil || got != "#cloud-config\nhostname: \"pf-p1\"\n" {
		t.Fatalf("default: %q, %v", got, err)
	}
	got, err = userData("#cloud-config\nfqdn: {{.Hostname}}.example\nwrite_files:\n  - path: /etc/proxy-id\n    content: {{.ID}}\n", "p1", "pf-p1")
	if err != nil || got != "#cloud-config\nfqdn: pf-p1.example\nwrite_files:\n  - path: /etc/proxy-id\n    content: p1\n" {
		t.Fatalf("template: %q, %v", got, err)
	}
	for name, c := range map[string]struct{ tmpl, id, host string }{
		"unknown field": {"{{.Secret}}", "p1", "pf-p1"},
		"bad template":  {"{{.ID", "p1", "pf-p1"},
		"bad id":        {"", "p1\nruncmd: [x]", "pf-p1"},
		"bad hostname":  {"", "p1", "pf-p1\nruncmd: [x]"},
	} {
		if got, err := userData(c.tmpl, c.id, c.host); err == nil {
			t.Errorf("%s: rendered %q", name, got)
		}
	}
}

// readISO reads every file in the image's root with the library's reader,
// and checks the volume id on the way.
func readISO(t *testing.T, img []byte) map[string]string {
	t.Helper()
	im, err := iso9660.OpenImage(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	label, err := im.Label()
	if err != nil || label != "cidata" {
		t.Fatalf("volume id %q, %v", label, err)
	}
	root, err := im.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	kids, err := root.GetChildren()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range kids {
		if k.IsDir() {
			t.Fatalf("unexpected directory %q", k.Name())
		}
		b, err := io.ReadAll(k.Reader())
		if err != nil {
			t.Fatal(err)
		}
		out[k.Name()] = string(b)
	}
	return out
}

// A valid proxy id or host name can look like a YAML bool, null or number
// ("true", "null", "123", "1.5", "yes", "012"); meta-data and the default
// user-data must still give cloud-init the string, not true or 123, or the
// guest gets no hostname or another one (found by FuzzSeed).
func TestSeed_valuesReadBackAsStrings(t *testing.T) {
	for _, v := range []string{"true", "null", "123", "1.5", "yes", "off", "012", "0x1f", "1e5"} {
		img, err := seedISO(v, v, "")
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		md := readISO(t, img)["meta-data"]
		if got := yamlStrings(t, md); got["instance-id"] != v || got["local-hostname"] != v {
			t.Errorf("%q: meta-data reads as %q:\n%s", v, got, md)
		}
		ud, err := userData("", "p1", v)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if got := yamlStrings(t, ud); got["hostname"] != v {
			t.Errorf("%q: default user-data reads as %q:\n%s", v, got, ud)
		}
	}
}
