package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"proxyfleet/bans"
	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// TestBanVerbs runs ban add, ls and rm, and the count in rotation,
// against an embedded NATS server with a health process answering the
// requests.
func TestBanVerbs(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	_, hjs := srv.Connect(t)
	h, err := health.New(hjs, health.Config{Subjects: subj, HTTPAddr: health.NoHTTP, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, h.Run, h.Started(), time.Minute)

	cli := func(args ...string) (stdout, stderr string, code int) {
		return runCLI(ctx, append(args, "--nats-url", srv.ClientURL())...)
	}
	want := func(what string, ok bool, stdout, stderr string) {
		t.Helper()
		wantCLI(t, what, ok, stdout, stderr)
	}

	o, e, code := cli("ban", "add", "203.0.113.7", "WWW.Shop.Example.", "--for", "30m", "--reason", "captcha wall")
	want("ban add", code == 0 && strings.HasPrefix(o, "banned 203.0.113.7 for shop.example until "), o, e)
	o, e, code = cli("ban", "add", "2001:db8::7", "198.51.100.1", "--for", "2h", "--json")
	var b bans.Ban
	want("ban add --json", code == 0 && json.Unmarshal([]byte(o), &b) == nil && b.Site == "198.51.100.1" && b.Source == bans.SourceCLI &&
		b.Until.Sub(b.At) == 2*time.Hour, o, e)

	o, e, code = cli("ban", "ls")
	rows := strings.Split(strings.TrimSuffix(o, "\n"), "\n")
	want("ban ls", code == 0 && len(rows) == 3 && strings.Join(strings.Fields(rows[0]), " ") == "SITE ADDRESS LEFT SOURCE BY REASON" &&
		strings.HasPrefix(strings.Join(strings.Fields(rows[1]), " "), "198.51.100.1 2001:db8::7 ") && strings.HasSuffix(rows[1], " cli     -   -") &&
		strings.HasPrefix(strings.Join(strings.Fields(rows[2]), " "), "shop.example 203.0.113.7 ") && strings.HasSuffix(rows[2], " cli     -   captcha wall"), o, e)
	o, e, code = cli("ban", "ls", "--site", "a.b.shop.example", "--json")
	var bs []bans.Ban
	want("ban ls --site", code == 0 && json.Unmarshal([]byte(o), &bs) == nil && len(bs) == 1 && bs[0].Address == "203.0.113.7", o, e)
	o, e, code = cli("ban", "ls", "--address", "2001:db8::7", "--json")
	want("ban ls --address", code == 0 && json.Unmarshal([]byte(o), &bs) == nil && len(bs) == 1 && bs[0].Site == "198.51.100.1", o, e)
	o, e, code = cli("ban", "ls", "--address", "2001:db8::7", "--site", "shop.example", "--json")
	want("ban ls --address --site", code == 0 && strings.TrimSpace(o) == "[]", o, e)

	o, e, code = cli("rotation")
	want("rotation counts the bans", code == 0 && strings.HasSuffix(o, "\n2 active bans (proxyfleet ban ls)\n"), o, e)

	o, e, code = cli("ban", "rm", "203.0.113.7", "shop.example")
	want("ban rm", code == 0 && strings.Contains(o, "lifted"), o, e)
	o, e, code = cli("ban", "ls", "--site", "shop.example", "--json")
	want("ban ls after rm", code == 0 && strings.TrimSpace(o) == "[]", o, e)

	// Refusals: usage errors exit 2, what health (or the client, first)
	// refuses exits 1 naming the field.
	o, e, code = cli("ban", "add", "203.0.113.7", "shop.example")
	want("ban add without --for", code == 2 && strings.Contains(e, "--for is required"), o, e)
	o, e, code = cli("ban", "add", "203.0.113.7", "--for", "1m")
	want("ban add without a site", code == 2 && strings.Contains(e, "usage: proxyfleet ban add ADDRESS SITE"), o, e)
	o, e, code = cli("ban", "add", "203.0.113.7", "shop..example", "--for", "1m")
	want("ban add of a bad site", code == 1 && strings.Contains(e, "site: "), o, e)
	o, e, code = cli("ban", "add", "203.0.113.7", "shop.example", "--for", "1ms")
	want("ban add too short", code == 1 && strings.Contains(e, "for: "), o, e)
	o, e, code = cli("ban", "ls", "--site", "a b")
	want("ban ls of a bad site", code == 1 && strings.Contains(e, "site"), o, e)
}

// wantCLI fails the test with a command's output unless ok.
func wantCLI(t *testing.T, what string, ok bool, stdout, stderr string) {
	t.Helper()
	if !ok {
		t.Fatalf("%s\nstdout:\n%s\nstderr:\n%s", what, stdout, stderr)
	}
}
