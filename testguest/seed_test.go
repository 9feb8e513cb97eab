package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseMetaDataYAML(t *testing.T) {
	m, err := ParseMetaData([]byte("---\ninstance-id: \"p1-3f2a\"\nlocal-hostname: 'proxy-p1' # comment\n# a comment\nnetwork-interfaces: |\n  auto eth0\n  iface eth0 inet dhcp\npublic-keys:\n  - ssh-ed25519 AAAA\nplain: value with spaces\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m["instance-id"] != "p1-3f2a" || m["local-hostname"] != "proxy-p1" || m["plain"] != "value with spaces" {
		t.Fatalf("got %v", m)
	}
	if _, ok := m["auto eth0"]; ok {
		t.Fatalf("nested content leaked: %v", m)
	}
}

func TestParseMetaDataJSON(t *testing.T) {
	m, err := ParseMetaData([]byte(`{"instance-id":"i-1","local-hostname":"h1","n":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if m["instance-id"] != "i-1" || m["local-hostname"] != "h1" || m["n"] != "3" {
		t.Fatalf("got %v", m)
	}
	if _, err := ParseMetaData([]byte(`{"instance-id":`)); err == nil {
		t.Fatal("want error")
	}
}

func TestReadSeedDir(t *testing.T) {
	d := t.TempDir()
	if _, err := ReadSeedDir(d); err == nil {
		t.Fatal("want error without meta-data")
	}
	os.WriteFile(filepath.Join(d, "meta-data"), []byte("local-hostname: x\n"), 0o644)
	if _, err := ReadSeedDir(d); err == nil {
		t.Fatal("want error without instance-id")
	}
	os.WriteFile(filepath.Join(d, "meta-data"), []byte("instance-id: abc\nlocal-hostname: x\n"), 0o644)
	s, err := ReadSeedDir(d)
	if err != nil || s.InstanceID != "abc" || s.LocalHostname != "x" || s.UserData != nil {
		t.Fatalf("%+v %v", s, err)
	}
	os.WriteFile(filepath.Join(d, "user-data"), []byte("#cloud-config\n"), 0o644)
	s, _ = ReadSeedDir(d)
	if string(s.UserData) != "#cloud-config\n" || s.NetworkConfig != nil {
		t.Fatalf("user-data %q, network-config %q", s.UserData, s.NetworkConfig)
	}
	os.WriteFile(filepath.Join(d, "network-config"), []byte("version: 2\n"), 0o644)
	s, _ = ReadSeedDir(d)
	if string(s.NetworkConfig) != "version: 2\n" {
		t.Fatalf("network-config %q", s.NetworkConfig)
	}
}

func TestCandidateDisks(t *testing.T) {
	d := t.TempDir()
	for _, n := range []string{"vdb", "vda", "vda1", "sr0", "tty0", "vdaa"} {
		os.WriteFile(filepath.Join(d, n), nil, 0o644)
	}
	got := CandidateDisks(d)
	want := []string{"vda", "vdb", "vdaa", "sr0"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if filepath.Base(got[i]) != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestReadSeedDirMangledNames(t *testing.T) {
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "META_DATA;1"), []byte("instance-id: m1\n"), 0o644)
	os.WriteFile(filepath.Join(d, "user_data."), []byte("ud"), 0o644)
	s, err := ReadSeedDir(d)
	if err != nil || s.InstanceID != "m1" || string(s.UserData) != "ud" {
		t.Fatalf("%+v %v", s, err)
	}
}
