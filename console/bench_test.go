package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/console"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// The fleet BenchmarkConsole50k looks at: fleet_50k's shape, 50,000
// proxies over 500 hosts in 10 pools, each with a desired record, a
// running event with its egress and a check record, as the worker and
// health write them.
const (
	bench50kProxies = 50000
	bench50kHosts   = 500
	bench50kPools   = 10
)

// seed50k writes the fleet into the streams and buckets of an embedded
// nats-server, the way the roles do.
func seed50k(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	subj := messages.NewSubjects("")
	now := time.Now().UTC()
	var futs []jetstream.PubAckFuture
	publish := func(subject string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		f, err := js.PublishAsync(subject, data)
		if err != nil {
			b.Fatal(err)
		}
		futs = append(futs, f)
		if len(futs) >= 4000 {
			wait(b, js, futs)
			futs = futs[:0]
		}
	}
	for i := range bench50kProxies {
		id := fmt.Sprintf("p-%05d", i)
		host := fmt.Sprintf("h%03d", i%bench50kHosts)
		labels := map[string]string{messages.PoolLabel: fmt.Sprintf("pool-%d", i%bench50kPools), "tier": "std"}
		ip := fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)
		cmd := "c-" + id
		publish("$KV."+messages.BucketDesired+"."+id, messages.Desired{V: 1, ID: id, Op: messages.OpCreate, Seq: uint64(i + 1), CommandID: cmd, Host: host, Image: "img", Labels: labels, At: now})
		publish(subj.State(id), messages.StateEvent{V: 1, ID: id, State: messages.StateRunning, Host: host, IP: ip, Port: 3128, Source: "worker",
			CommandID: cmd, CommandSeq: uint64(i + 1), Seq: 3, At: now, Labels: labels, Egress: []string{ip, fmt.Sprintf("2001:db8:%x::1", i)}})
		publish("$KV."+messages.BucketChecks+"."+id, messages.CheckRecord{V: 1, ID: id, Addr: fmt.Sprintf("%s:3128", ip), Egress: ip, Verdict: messages.VerdictOK, At: now})
	}
	wait(b, js, futs)
}

func wait(b *testing.B, js jetstream.JetStream, futs []jetstream.PubAckFuture) {
	b.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged within a minute")
	}
	for _, f := range futs {
		select {
		case err := <-f.Err():
			b.Fatal(err)
		default:
		}
	}
}

// BenchmarkConsole50k: the proxies page at 50,000 proxies, logged in,
// once the console's view has read the fleet: its first page, and a
// filter by host. It reports each as seconds per request (first-view-s,
// filter-host-s), the figures the bench tool's console section holds to
// a second.
func BenchmarkConsole50k(b *testing.B) {
	srv := natstest.Start(b)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	if _, err := (topology.Topology{Subjects: messages.NewSubjects("")}).Setup(ctx, js); err != nil {
		b.Fatal(err)
	}
	seed50k(b, js)
	c, err := client.New(nc, "")
	if err != nil {
		b.Fatal(err)
	}
	con, err := console.New(c, console.Config{Users: []console.User{{Name: "viewer", Password: viewerPW}}, Logger: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	runtest.Start(b, func(ctx context.Context) error { return con.Serve(ctx, ln) }, con.Started(), 10*time.Second)
	br := &browser{t: b, base: "http://" + ln.Addr().String(), hc: newJarClient()}
	br.login("viewer", viewerPW)
	// Ready when the page counts the whole fleet (it waits for the
	// view's first read).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, body := br.do("GET", "/proxies", nil)
		if m := countRE.FindStringSubmatch(body); m != nil && m[1] == strconv.Itoa(bench50kProxies) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the proxies page does not count the fleet within 3 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantHost := strconv.Itoa(bench50kProxies / bench50kHosts)
	var first, filter time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if got := br.proxyCount("/proxies"); got != strconv.Itoa(bench50kProxies) {
			b.Fatalf("first view counts %s", got)
		}
		first += time.Since(start)
		start = time.Now()
		if got := br.proxyCount("/proxies?host=h123"); got != wantHost {
			b.Fatalf("host filter counts %s, want %s", got, wantHost)
		}
		filter += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(first.Seconds()/float64(b.N), "first-view-s")
	b.ReportMetric(filter.Seconds()/float64(b.N), "filter-host-s")
}
