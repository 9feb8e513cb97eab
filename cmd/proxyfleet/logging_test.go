package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// checkRecord decodes one JSON log record, failing on a key repeated in
// any object of it, and returns its top-level fields.
func checkRecord(line []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if seen[key] {
					return fmt.Errorf("key %q repeated", key)
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	if err := walk(); err != nil {
		return nil, err
	}
	var rec map[string]any
	return rec, json.Unmarshal(line, &rec)
}

// durationKeys are keys our roles log durations under.
var durationKeys = []string{"grace", "lease_ttl", "heartbeat", "liveness", "delay", "waited", "took", "interval", "elapsed"}

// TestLogsNameEachKeyOnceAndDurationsAsStrings: serve's JSON log of a
// create and a delete on a sim host has no record that repeats a key and
// writes every duration as a string ("30s"), and the embedded
// nats-server's own errors reach it.
func TestLogsNameEachKeyOnceAndDurationsAsStrings(t *testing.T) {
	isolateNATSEnv(t)
	srv, stop := serveSim(t, "", "--log-format", "json", "--log-level", "debug")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"create", "p1", "--wait"}, {"delete", "p1", "--wait"}} {
		if o, e, code := runCLI(ctx, append(args, "--server", srv.url)...); code != 0 {
			t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, o, e)
		}
	}
	// A client that speaks nonsense: the server logs a parser error.
	u, _ := url.Parse(srv.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil { // its INFO
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("NONSENSE\r\n")); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// (Checked below: a missing record fails there, with the rest.)
	poll.Wait(30*time.Second, func() bool { return strings.Contains(srv.logs.String(), `"component":"nats-server"`) })
	stop()

	var records, durations int
	serverErr := false
	for line := range bytes.Lines([]byte(srv.logs.String())) {
		rec, err := checkRecord(line)
		if err != nil {
			t.Errorf("%v: %s", err, line)
			continue
		}
		records++
		for _, k := range durationKeys {
			if v, ok := rec[k]; ok {
				durations++
				if _, isString := v.(string); !isString {
					t.Errorf("duration %s is not a string: %s", k, line)
				}
			}
		}
		if rec["component"] == "nats-server" && rec["level"] == "ERROR" && strings.Contains(fmt.Sprint(rec["msg"]), "parser") {
			serverErr = true
		}
	}
	if records < 10 || durations < 3 || !serverErr {
		t.Errorf("%d records, %d durations, the server's parser error logged %v; want ≥10, ≥3, true\n%s", records, durations, serverErr, srv.logs.String())
	}
}
