package worker

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// A worker publishes the observation ticks of the hosts it pulls, and none
// of a host it can execute but does not pull (its puller does).
func TestTicksOnlyForThePulledHosts(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamWork, Subjects: []string{subj.WorkAll()}}); err != nil {
		t.Fatal(err)
	}
	w := &Worker{metrics: newMetrics(), js: js, subj: subj, now: time.Now, log: slog.New(slog.DiscardHandler), cfg: Config{ObserveInterval: 50 * time.Millisecond}}
	pulled, other := &consumerRun{w: w, host: "h1"}, &consumerRun{w: w, host: "h2"}
	pulled.pulling.Store(true)
	var mu sync.Mutex
	ticks := map[string]int{}
	sub, err := nc.Subscribe(subj.Work("*", observeToken), func(m *nats.Msg) {
		host, _, _ := subj.ParseWork(m.Subject)
		mu.Lock()
		ticks[host]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	loopCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.tickLoop(loopCtx, []*consumerRun{pulled, other})
	}()
	defer func() { stop(); <-done }()
	poll.Until(t, "five ticks of h1", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ticks["h1"] >= 5
	})
	mu.Lock()
	defer mu.Unlock()
	if ticks["h2"] != 0 {
		t.Errorf("%d ticks of h2, which this worker does not pull; want none", ticks["h2"])
	}
}
