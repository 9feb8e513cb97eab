package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"proxyfleet/config"
)

// The console role needs console.listen, and its users' password files,
// which it reads before it connects: a missing one names its field.
func TestConsoleRoleRefusesAMissingPart(t *testing.T) {
	dir := t.TempDir()
	base := "hosts:\n  - {name: h1, driver: sim, sim: {dir: " + dir + "}}\n"
	noListen := filepath.Join(dir, "nolisten.yaml")
	writeFile(t, noListen, base)
	var out bytes.Buffer
	err := run(context.Background(), "console", []string{"--config", noListen}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "console.listen is required") {
		t.Fatalf("console without console.listen: %v", err)
	}
	noFile := filepath.Join(dir, "nofile.yaml")
	writeFile(t, noFile, base+"console: {listen: '127.0.0.1:0', users: [{name: ops, password_file: "+dir+"/missing, admin: true}]}\n")
	err = run(context.Background(), "console", []string{"--config", noFile, "-s", "nats://127.0.0.1:1"}, &out, &out)
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Field != "console.users[0].password_file" {
		t.Fatalf("console with a missing password file: %v, want an error naming console.users[0].password_file", err)
	}
}
