package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"proxyfleet/config"
)

// TestMain runs the tests, fails the run on a goroutine left running,
// and removes what the tests shared (the built binary).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeBuilt()
		os.Exit(code)
	}))
}

func TestServeRefusesABadConfigNamingTheField(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, "hosts:\n  - {name: h1, driver: sim, sim: {dir: /tmp/x}}\nproxy: {port: 0, cpus: 99}\n")
	var stderr bytes.Buffer
	err := run(context.Background(), "serve", []string{"--config", bad, "--data-dir", t.TempDir()}, &stderr, &stderr)
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Field != "proxy.cpus" || !strings.Contains(err.Error(), "proxy.cpus") {
		t.Fatalf("serve with a bad config: %v, want an error naming proxy.cpus", err)
	}
}

func TestUnknownCommandIsUsageError(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), "frobnicate", nil, &out, &out)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(out.String(), "Usage") {
		t.Fatalf("err %v, output %q", err, out.String())
	}
}
