package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rw joins a reader of requests and a buffer of replies.
type rw struct {
	io.Reader
	Buffer bytes.Buffer
}

func (r *rw) Write(p []byte) (int, error) { return r.Buffer.Write(p) }

func serve(t *testing.T, h *AgentHandler, in string) []map[string]any {
	t.Helper()
	c := &rw{Reader: strings.NewReader(in)}
	if err := h.Serve(c); err != io.EOF {
		t.Fatalf("Serve: %v, want EOF", err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(c.Buffer.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		line = strings.TrimPrefix(line, "\xff")
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("reply %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestAgentSyncEchoesID(t *testing.T) {
	h := &AgentHandler{}
	got := serve(t, h, "\xff\xff{\"execute\":\"guest-sync\",\"arguments\":{\"id\":1234567890123}}\n")
	if len(got) != 1 {
		t.Fatalf("replies %v", got)
	}
	if got[0]["return"] != float64(1234567890123) {
		t.Fatalf("guest-sync returned %v", got[0])
	}
}

func TestAgentSyncDelimitedPrefixesFF(t *testing.T) {
	h := &AgentHandler{}
	c := &rw{Reader: strings.NewReader(`{"execute":"guest-sync-delimited","arguments":{"id":7}}`)}
	h.Serve(c)
	if got := c.Buffer.String(); got != "\xff{\"return\":7}\n" {
		t.Fatalf("reply %q", got)
	}
}

func TestAgentPingInfoAndUnknown(t *testing.T) {
	h := &AgentHandler{}
	got := serve(t, h, `{"execute":"guest-ping"}{"execute":"guest-info"}
{"execute":"guest-exec","arguments":{"path":"/bin/sh"}}
{"execute":"guest-ping","id":"abc"}
`)
	if len(got) != 4 {
		t.Fatalf("replies %v", got)
	}
	if r, ok := got[0]["return"].(map[string]any); !ok || len(r) != 0 {
		t.Fatalf("guest-ping: %v", got[0])
	}
	info := got[1]["return"].(map[string]any)
	if info["version"] == "" {
		t.Fatalf("guest-info: %v", info)
	}
	var names []string
	for _, c := range info["supported_commands"].([]any) {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	if !strings.Contains(strings.Join(names, ","), "guest-network-get-interfaces") {
		t.Fatalf("supported: %v", names)
	}
	if e := got[2]["error"].(map[string]any); e["class"] != "CommandNotFound" {
		t.Fatalf("unknown: %v", got[2])
	}
	if got[3]["id"] != "abc" {
		t.Fatalf("id not echoed: %v", got[3])
	}
}

func TestAgentNetworkInterfacesFormat(t *testing.T) {
	h := &AgentHandler{Interfaces: func() ([]GuestInterface, error) {
		return InterfacesFromNet([]net.Interface{
			{Name: "lo", Flags: net.FlagLoopback},
			{Name: "eth0", HardwareAddr: net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}},
		}, func(i net.Interface) ([]net.Addr, error) {
			if i.Name == "lo" {
				return []net.Addr{&net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}, nil
			}
			return []net.Addr{
				&net.IPNet{IP: net.IPv4(198, 18, 100, 23), Mask: net.CIDRMask(24, 32)},
				&net.IPNet{IP: net.ParseIP("fe80::5054:ff:fe01:203"), Mask: net.CIDRMask(64, 128)},
			}, nil
		})
	}}
	c := &rw{Reader: strings.NewReader(`{"execute":"guest-network-get-interfaces"}`)}
	h.Serve(c)
	want := `{"return":[{"name":"lo","hardware-address":"00:00:00:00:00:00","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"127.0.0.1","prefix":8}]},` +
		`{"name":"eth0","hardware-address":"52:54:00:01:02:03","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"198.18.100.23","prefix":24},{"ip-address-type":"ipv6","ip-address":"fe80::5054:ff:fe01:203","prefix":64}]}]}` + "\n"
	if got := c.Buffer.String(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}

	h.Interfaces = func() ([]GuestInterface, error) { return nil, errors.New("boom") }
	got := serve(t, h, `{"execute":"guest-network-get-interfaces"}`)
	if got[0]["error"] == nil {
		t.Fatalf("want error, got %v", got[0])
	}
}

func TestAgentReaderSplitsAndResyncs(t *testing.T) {
	in := "  {\"a\":\"}{\\\"\"}\n{\"b\":[1,{\"c\":2}]}\xff\xff{\"partial\":\xff{\"d\":1}garbage line\n{\"e\":1}"
	rd := NewAgentReader(strings.NewReader(in))
	var objs []string
	var errs []error
	for {
		b, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, string(b))
	}
	want := []string{`{"a":"}{\""}`, `{"b":[1,{"c":2}]}`, `{"d":1}`, `{"e":1}`}
	if strings.Join(objs, "|") != strings.Join(want, "|") {
		t.Fatalf("objects %q, want %q", objs, want)
	}
	if len(errs) != 2 || errs[0] != errResync || errs[1] != errNotObject {
		t.Fatalf("errors %v", errs)
	}
}

func TestAgentBadJSONGetsError(t *testing.T) {
	got := serve(t, &AgentHandler{}, `{"execute":}`+"\n"+`{"execute":"guest-sync"}`)
	if len(got) != 2 || got[0]["error"] == nil || got[1]["error"] == nil {
		t.Fatalf("replies %v", got)
	}
}

func TestFindVirtioPort(t *testing.T) {
	sys := t.TempDir()
	for name, port := range map[string]string{"vport1p1": "org.qemu.other", "vport2p1": AgentPortName} {
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		os.WriteFile(filepath.Join(sys, name, "name"), []byte(port+"\n"), 0o644)
	}
	p, err := FindVirtioPort(sys, "/dev", AgentPortName)
	if err != nil || p != "/dev/vport2p1" {
		t.Fatalf("got %q %v", p, err)
	}
	if _, err := FindVirtioPort(sys, "/dev", "nope"); err == nil {
		t.Fatal("want error")
	}
}

// TestAgentStopStart runs the Agent on a FIFO standing in for the port.
func TestAgentStopStart(t *testing.T) {
	dir := t.TempDir()
	port := filepath.Join(dir, "vport0p1")
	// A FIFO opened O_RDWR does not block and reads what we write to it;
	// replies go to the same FIFO, so we only check that requests are
	// consumed while running and the file is closed when stopped.
	if err := mkfifo(port); err != nil {
		t.Fatal("mkfifo:", err)
	}
	a := &Agent{Handler: &AgentHandler{}, Locate: func() (string, error) { return port, nil }, Log: discardLogger()}
	a.Start()
	if !a.Running() {
		t.Fatal("not running")
	}
	if !waitFor(2*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.f != nil }) {
		t.Fatal("port not opened")
	}
	a.Stop()
	if a.Running() {
		t.Fatal("still running")
	}
	a.mu.Lock()
	f := a.f
	a.mu.Unlock()
	if f != nil {
		t.Fatal("port still open after Stop")
	}
	a.Start()
	if !waitFor(2*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.f != nil }) {
		t.Fatal("port not reopened")
	}
	a.Stop()
}

func TestAgentShutdown(t *testing.T) {
	var modes []string
	h := &AgentHandler{Shutdown: func(m string) { modes = append(modes, m) }}
	got := serve(t, h, `{"execute":"guest-shutdown"}{"execute":"guest-shutdown","arguments":{"mode":"reboot"}}{"execute":"guest-shutdown","arguments":{"mode":"explode"}}`)
	if len(got) != 1 || got[0]["error"] == nil {
		t.Fatalf("replies %v (only the bad mode answers)", got)
	}
	if strings.Join(modes, ",") != "powerdown,reboot" {
		t.Fatalf("modes %v", modes)
	}
	got = serve(t, &AgentHandler{}, `{"execute":"guest-shutdown"}`)
	if len(got) != 1 || got[0]["error"] == nil {
		t.Fatalf("without Shutdown: %v", got)
	}
}
