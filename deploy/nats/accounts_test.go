// Package nats_test checks deploy/nats/accounts.conf: a real nats-server
// loads it, and a worker, a health process and the client verbs each run as
// their own user, with only that role's permissions.
package nats_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

func TestRolesRunUnderTheirPermissions(t *testing.T) {
	for k, v := range map[string]string{
		"PROXYFLEET_CLIENT_PASSWORD": "c-pass", "PROXYFLEET_WORKER_PASSWORD": "w-pass",
		"PROXYFLEET_HEALTH_PASSWORD": "h-pass", "NATS_SYS_PASSWORD": "s-pass",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile("accounts.conf")
	if err != nil {
		t.Fatalf("accounts.conf: %v", err)
	}
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()

	// Every permission refusal reaches the connection's error handler.
	var mu sync.Mutex
	var refused []string
	connect := func(user, pass string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, pass), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			refused = append(refused, user+": "+err.Error())
			mu.Unlock()
		}))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return nc, js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Health first: it creates the streams and buckets it needs.
	_, hjs := connect("health", "h-pass")
	subj := messages.NewSubjects("")
	if err := (worker.Topology{Subjects: subj}).EnsureStreams(ctx, hjs); err != nil {
		t.Fatalf("health ensures the streams: %v", err)
	}
	h, err := health.New(hjs, health.Config{Subjects: subj, HTTPAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatalf("health as health: %v", err)
	}
	defer h.Stop(context.Background())

	_, wjs := connect("worker", "w-pass")
	d, err := sim.New(sim.Config{Host: "h1", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wjs, worker.Config{
		Subjects: subj, Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128},
		Providers: map[string]worker.Provider{"h1": d}, PollInterval: 10 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("worker as worker: %v", err)
	}
	defer w.Stop(context.Background())

	cnc, _ := connect("client", "c-pass")
	cl, err := client.New(cnc, "")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cl.Create(ctx, messages.CreateCommand{ID: "p1"}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("create as client: %+v %v", o, err)
	}
	st, err := cl.Get(ctx, "p1")
	if err != nil || st.State() != messages.StateRunning {
		t.Fatalf("get as client: %+v %v", st, err)
	}
	var rot messages.Rotation
	if !poll.Wait(20*time.Second, func() bool {
		rot, err = cl.Rotation(ctx)
		return err == nil && len(rot.Proxies) == 1
	}) {
		t.Fatalf("rotation as client: %+v %v (health publishes it)", rot, err)
	}
	if _, err := cl.Delete(ctx, "p1", "", true); err != nil {
		t.Fatalf("delete as client: %v", err)
	}
	// A client may not pretend to be a worker.
	if err := cnc.Publish(subj.State("p1"), []byte(`{}`)); err == nil {
		_ = cnc.Flush()
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	var others []string
	sawStateRefusal := false
	for _, r := range refused {
		if strings.HasPrefix(r, "client: ") && strings.Contains(r, `Publish to "proxy.state.p1"`) {
			sawStateRefusal = true
			continue
		}
		others = append(others, r)
	}
	if len(others) > 0 {
		t.Errorf("refusals: %v", others)
	}
	if !sawStateRefusal {
		t.Errorf("a client publishing a state event was not refused (refusals: %v)", refused)
	}
}
