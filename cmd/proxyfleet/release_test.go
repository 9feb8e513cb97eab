package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestReleaseBinaryHasNoKillPoints builds proxyfleet as a release is built
// (no tags) and as the end-to-end tests build it (-tags killpoints): the
// test-only SIGKILL points and the variables that switch them on are in
// the second and nowhere in the first.
func TestReleaseBinaryHasNoKillPoints(t *testing.T) {
	traces := []string{"PROXYFLEET_TEST_KILL_AT", "PROXYFLEET_TEST_KILL_ONCE", "test seam: SIGKILL"}
	build := func(name string, args ...string) []byte {
		t.Helper()
		bin := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("go", append(append([]string{"build", "-o", bin}, args...), ".")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", args, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	release := build("release")
	for _, s := range traces {
		if bytes.Contains(release, []byte(s)) {
			t.Errorf("release build (no tags) holds %q: the kill points ship", s)
		}
	}
	// The same check finds them where they are, so its silence above
	// means something.
	tagged := build("killpoints", "-tags", "killpoints")
	for _, s := range traces {
		if !bytes.Contains(tagged, []byte(s)) {
			t.Errorf("-tags killpoints build lacks %q", s)
		}
	}
}
