package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/config"
	"proxyfleet/messages"
)

// rotationLog records every change of PROXY_ROTATION and every snapshot on
// proxy.rotation.
type rotationLog struct {
	kv       jetstream.KeyValue
	mu       sync.Mutex
	members  map[string]string
	entered  map[string]bool // every id ever put
	removed  []string        // "id at time"
	revision uint64          // the highest revision of the bucket read
	feed     int             // messages read on the feed, proxy.rotation.changes
	versions []uint64
	backward []string
}

func (r *rotationLog) has(ids ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if _, ok := r.members[id]; !ok {
			return false
		}
	}
	return true
}

// everEntered reports whether id was ever in the rotation while watched.
func (r *rotationLog) everEntered(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.entered[id]
}

func (r *rotationLog) lacks(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.members[id]
	return !ok
}

func (r *rotationLog) removals() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.removed...)
}

func (r *rotationLog) feedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.feed
}

func (r *rotationLog) lastRevision() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.revision
}

// caughtUp waits until the log holds whatever the publishing health
// process had decided when it was called: two messages on the rotation's
// feed read after the call, then the bucket read up to its last
// revision. The holder sends a message at least every third of the
// lease's TTL (a heartbeat if nothing changed), each after a publish
// that took every change folded before that publish began, and writes a
// message's puts and deletes before it sends it. One message read after
// the call may have been sent before it; the second comes from a later
// publish (but for a change too large for one message).
func (r *rotationLog) caughtUp(t *testing.T, bound time.Duration) {
	t.Helper()
	n := r.feedCount()
	waitUntil(t, "two messages on the rotation's feed", bound, func() bool { return r.feedCount() >= n+2 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := r.kv.Status(ctx)
	if err != nil {
		t.Fatalf("rotation bucket status: %v", err)
	}
	last := st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	waitUntil(t, fmt.Sprintf("the rotation's watch to read revision %d", last), bound, func() bool { return r.lastRevision() >= last })
}

// probeRounds waits until the health process serving /metrics at addr has
// run rounds more probes of each of its targets (counted over all of
// them).
func probeRounds(t *testing.T, addr string, rounds int, bound time.Duration) {
	t.Helper()
	mfs := scrape(t, addr)
	from, targets := value(mfs, "proxyfleet_probes_total"), value(mfs, "proxyfleet_probe_targets")
	want := from + float64(rounds)*max(targets, 1)
	waitUntil(t, fmt.Sprintf("%d more rounds of probes of %v targets by %s", rounds, targets, addr), bound, func() bool {
		return value(scrape(t, addr), "proxyfleet_probes_total") >= want
	})
}

func (r *rotationLog) addrs() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for k, v := range r.members {
		out[k] = v
	}
	return out
}

// watchRotation follows the bucket and the snapshots until the test ends.
func (e *e2e) watchRotation() *rotationLog {
	t := e.t
	r := &rotationLog{members: map[string]string{}, entered: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var kv jetstream.KeyValue
	waitUntil(t, "the rotation bucket", 30*time.Second, func() bool {
		var err error
		kv, err = e.js.KeyValue(ctx, messages.BucketRotation)
		return err == nil
	})
	r.kv = kv
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for entry := range w.Updates() {
			if entry == nil {
				continue // the initial values are in
			}
			r.mu.Lock()
			r.revision = max(r.revision, entry.Revision())
			if entry.Operation() == jetstream.KeyValuePut {
				r.members[entry.Key()] = string(entry.Value())
				r.entered[entry.Key()] = true
			} else {
				delete(r.members, entry.Key())
				r.removed = append(r.removed, entry.Key()+" at "+time.Now().Format(time.TimeOnly))
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = w.Stop(); cancel(); <-done })
	sub, err := e.nc.Subscribe("proxy.rotation", func(m *nats.Msg) {
		var snap messages.Rotation
		if json.Unmarshal(m.Data, &snap) != nil {
			return
		}
		r.mu.Lock()
		if n := len(r.versions); n > 0 && snap.Version <= r.versions[n-1] {
			r.backward = append(r.backward, fmt.Sprintf("%d after %d", snap.Version, r.versions[n-1]))
		}
		r.versions = append(r.versions, snap.Version)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	feed, err := e.nc.Subscribe("proxy.rotation.changes", func(*nats.Msg) {
		r.mu.Lock()
		r.feed++
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = feed.Unsubscribe() })
	return r
}

// target is an HTTP server on the root namespace's test address, where the
// guests reach it, answering a value made up for this run.
func target(t *testing.T, ip string) (url, token string) {
	t.Helper()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	token = hex.EncodeToString(b)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, token) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/", token
}

// through fetches u through the forward proxy at addr with the fleet's
// credential (proxy.auth) when it has one.
func (e *e2e) through(addr, u string) (string, error) {
	resp, err := throughAs(addr, u, proxyUser(e.cfg))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("through %s: %s", addr, resp.Status)
	}
	return string(b), err
}

// proxyUser is the fleet's proxy credential as URL user info (nil when
// none is configured).
func proxyUser(c *config.Config) *url.Userinfo {
	if c.Proxy.Auth.User == "" {
		return nil
	}
	return url.UserPassword(c.Proxy.Auth.User, c.Proxy.Auth.Password.Reveal())
}

// throughAs sends a GET of u through the forward proxy at addr with user
// (nil: no credentials) and returns the answer, whatever its status.
func throughAs(addr, u string, user *url.Userinfo) (*http.Response, error) {
	pu := &url.URL{Scheme: "http", Host: addr, User: user}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true}}
	return c.Get(u)
}

// guestControl asks a test guest's control API (port 9090) to do something.
func guestControl(t *testing.T, ip, path string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post("http://"+ip+":9090"+path, "text/plain", nil)
	if err != nil {
		t.Fatalf("guest %s %s: %v", ip, path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("guest %s %s: %s", ip, path, resp.Status)
	}
}

// healthRole reads which role a health process plays from its header.
func healthRole(addr string) string {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return ""
	}
	resp.Body.Close()
	return resp.Header.Get("X-Proxyfleet-Lease")
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestEndToEndRotation drives the whole system with real parts: commands on
// NATS become real VMs that proxy traffic and sit in the rotation; the
// publishing health process is killed and a standby takes over; a proxy
// whose service stops leaves after `fall` failed probes while its
// neighbours stay; an agent-only outage (the guest agent stopped, no other
// address source answering) never costs a proxy its place; a
// VM destroyed behind the system's back leaves within an observation
// interval plus `fall` probes; a delete takes a proxy out and leaves nothing
// on the host.
func TestEndToEndRotation(t *testing.T) {
	const (
		interval = time.Second
		fall     = 2
		observe  = 2 * time.Second
		slack    = 10 * time.Second
	)
	rootIP := os.Getenv("TESTHOST_ROOT_IP")
	if rootIP == "" {
		rootIP = "198.18.0.1"
	}
	e := newE2E(t, func(c *config.Config) {
		c.Worker.ObserveInterval = observe
		c.Health = config.Health{
			HTTP: "127.0.0.1:0", ProbeListen: rootIP + ":0",
			Interval: interval, Timeout: 800 * time.Millisecond, Rise: 2, Fall: fall,
			Grace: 30 * time.Second, Concurrency: 16, LeaseTTL: 3 * time.Second,
		}
	})
	ids := []string{"e2e-a", "e2e-b", "e2e-c"}
	e.cleanupProxies(ids...)
	targetURL, token := target(t, rootIP)

	e.worker("w1")
	h1Addr, h2Addr := freePort(t), freePort(t)
	h1 := e.start("h1", nil, "health", "--config", e.path, "--http", h1Addr)
	waitUntil(t, "h1 to hold the lease", 30*time.Second, func() bool { return healthRole(h1Addr) == "holder" })
	e.start("h2", nil, "health", "--config", e.path, "--http", h2Addr)
	waitUntil(t, "h2 to stand by", 30*time.Second, func() bool { return healthRole(h2Addr) == "standby" })
	rot := e.watchRotation()

	// Three creates → three guests → three running events → three in the
	// rotation, each proxying to this run's target.
	var cmds []string
	for _, id := range ids {
		cmds = append(cmds, e.command(messages.OpCreate, id))
	}
	e.waitDone(4*time.Minute, cmds...)
	waitUntil(t, "three proxies in the rotation", time.Minute, func() bool { return rot.has(ids...) })
	for id, addr := range rot.addrs() {
		got, err := e.through(addr, targetURL)
		if err != nil || got != token {
			t.Fatalf("through %s (%s): %q, %v; want the run's token", id, addr, got, err)
		}
	}

	// The publishing health process is killed; the standby takes over.
	before := len(rot.removals())
	h1.kill()
	waitUntil(t, "h2 to take the lease", 30*time.Second, func() bool { return healthRole(h2Addr) == "holder" })
	// The new holder publishes (its first message reconciles the bucket
	// with its fold), and probes keep passing: fall+1 rounds of probes,
	// enough for `fall` failures in a row whatever the rounds' phase,
	// and what they decided published and read.
	probeRounds(t, h2Addr, fall+1, time.Duration(fall+1)*interval+slack)
	rot.caughtUp(t, slack)
	if r := rot.removals(); len(r) != before {
		t.Errorf("passing proxies removed across the takeover: %v", r[before:])
	}

	// Delete one: it leaves the rotation, and the host, at once.
	d := e.command(messages.OpDelete, "e2e-c")
	e.waitDone(time.Minute, d)
	waitUntil(t, "e2e-c out of the rotation", slack, func() bool { return rot.lacks("e2e-c") })
	if doms, vols := e.hostObjects("e2e-c"); len(doms)+len(vols) != 0 {
		t.Errorf("after delete, on the host: domains %v, volumes %v", doms, vols)
	}

	ipOf := func(id string) string {
		host, _, _ := net.SplitHostPort(rot.addrs()[id])
		return host
	}
	// The proxy service inside e2e-a stops, its VM stays up: it leaves
	// after `fall` failed probes; e2e-b stays.
	guestControl(t, ipOf("e2e-a"), "/proxy/stop")
	stopped := time.Now()
	// The bound is fall probes plus a generous slack for a loaded machine;
	// the log line says how long it really took.
	waitUntil(t, "e2e-a out of the rotation", time.Duration(fall)*interval+slack, func() bool { return rot.lacks("e2e-a") })
	t.Logf("e2e-a left %s after its service stopped", time.Since(stopped).Round(100*time.Millisecond))
	if rot.lacks("e2e-b") {
		t.Fatal("e2e-b left with e2e-a")
	}

	// An agent-only outage in which no other address source answers:
	// e2e-b's guest agent stops and the DHCP lease forgets it (ARP errors
	// on this libvirt while the host's neighbour table is small, which
	// flushNeighbours sees to), so the lease source answers cleanly with
	// nothing and the worker reports provisioning with no address.
	// The same command and host report it: e2e-b keeps its place on its
	// grace, still probed and passing, and never leaves; agent and lease
	// back, it reports running again.
	before = len(rot.removals())
	ipB := ipOf("e2e-b")
	n := e.eventCount("e2e-b")
	restoreLease := hideLease(t, e.cfg.Hosts[0].Network, ipB)
	guestControl(t, ipB, "/agent/stop")
	flushNeighbours(t)
	outage := time.Now()
	var prov messages.StateEvent
	waitUntil(t, "e2e-b reported provisioning with no address", observe+slack, func() bool {
		for _, ev := range e.eventsSince("e2e-b", n) {
			if ev.State == messages.StateProvisioning && ev.IP == "" {
				prov = ev
				return true
			}
		}
		return false
	})
	t.Logf("e2e-b reported provisioning (%q) %s after its agent stopped", prov.Reason, time.Since(outage).Round(100*time.Millisecond))
	if !rot.has("e2e-b") {
		t.Errorf("e2e-b left the rotation when it reported provisioning: removals %v", rot.removals()[before:])
	}
	n = e.eventCount("e2e-b")
	guestControl(t, ipB, "/agent/start")
	restoreLease()
	waitUntil(t, "e2e-b reported running again", observe+slack, func() bool {
		for _, ev := range e.eventsSince("e2e-b", n) {
			if ev.State == messages.StateRunning && ev.IP == ipB {
				return true
			}
		}
		return false
	})
	t.Logf("e2e-b reported running again %s after the outage began", time.Since(outage).Round(100*time.Millisecond))
	// A proxy taken out would be back by now, its removal recorded; and
	// fall+1 rounds of probes more, published and read, would take one
	// out that fails.
	waitUntil(t, "e2e-b in the rotation", slack, func() bool { return rot.has("e2e-b") })
	probeRounds(t, h2Addr, fall+1, time.Duration(fall+1)*interval+slack)
	rot.caughtUp(t, slack)
	if r := rot.removals(); len(r) != before {
		t.Errorf("an agent-only outage removed: %v", r[before:])
	}

	// e2e-b is destroyed behind the system's back: it leaves within an
	// observation interval plus `fall` probes.
	virsh(t, "destroy", "pf-e2e-b")
	destroyed := time.Now()
	waitUntil(t, "e2e-b out of the rotation", observe+time.Duration(fall)*interval+slack, func() bool { return rot.lacks("e2e-b") })
	t.Logf("e2e-b left %s after virsh destroy", time.Since(destroyed).Round(100*time.Millisecond))

	rot.mu.Lock()
	defer rot.mu.Unlock()
	if len(rot.backward) > 0 {
		t.Errorf("snapshot versions went back: %v", rot.backward)
	}
	if len(rot.versions) == 0 {
		t.Error("no snapshot on proxy.rotation")
	}
}

func (e *e2e) eventCount(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events[id])
}

// eventsSince returns id's events after the first n.
func (e *e2e) eventsSince(id string, n int) []messages.StateEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]messages.StateEvent(nil), e.events[id][n:]...)
}

// dnsmasqDir is where libvirt keeps its networks' DHCP leases: libvirt's
// network driver reads a network's leases from <bridge>.status there on
// every lease lookup (virsh domifaddr --source lease).
const dnsmasqDir = "/var/lib/libvirt/dnsmasq"

// hideLease removes ip's entry from the DHCP lease file of network, so the
// lease source answers cleanly with nothing for that guest, and returns a
// function that puts it back (also run when the test ends).
func hideLease(t *testing.T, network, ip string) (restore func()) {
	t.Helper()
	var nw libvirtxml.Network
	if err := nw.Unmarshal(virsh(t, "net-dumpxml", network)); err != nil {
		t.Fatalf("network %s: %v", network, err)
	}
	if nw.Bridge == nil || nw.Bridge.Name == "" {
		t.Fatalf("network %s has no bridge", network)
	}
	path := filepath.Join(dnsmasqDir, nw.Bridge.Name+".status")
	read := func() []map[string]any {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("leases: %v", err)
		}
		var leases []map[string]any
		if len(bytes.TrimSpace(b)) > 0 {
			if err := json.Unmarshal(b, &leases); err != nil {
				t.Fatalf("leases in %s: %v", path, err)
			}
		}
		return leases
	}
	write := func(leases []map[string]any) {
		b, err := json.MarshalIndent(leases, "", "    ")
		if err != nil {
			t.Fatal(err)
		}
		tmp := path + ".pftest"
		if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
			t.Fatalf("leases: %v", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatalf("leases: %v", err)
		}
	}
	var kept, hidden []map[string]any
	for _, l := range read() {
		if l["ip-address"] == ip {
			hidden = append(hidden, l)
		} else {
			kept = append(kept, l)
		}
	}
	if len(hidden) == 0 {
		t.Fatalf("no lease of %s in %s: the lease source would not answer for it anyway", ip, path)
	}
	write(kept)
	var once sync.Once
	restore = func() {
		once.Do(func() {
			// Put it back among what the file holds now (dnsmasq may
			// have written other leases meanwhile).
			leases := read()
			for _, h := range hidden {
				if !slices.ContainsFunc(leases, func(l map[string]any) bool { return l["mac-address"] == h["mac-address"] }) {
					leases = append(leases, h)
				}
			}
			write(leases)
		})
	}
	t.Cleanup(restore)
	return restore
}
