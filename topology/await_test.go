package topology_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/topology"
)

// logs is a log's text, written and read from several goroutines.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// An Awaiter says at error level which stream or bucket is missing, waits
// for set-up to make it, says how long it waited, and returns its handle.
func TestAwaiterWaitsForWhatIsMissing(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := ctxFor(t, 30*time.Second)
	var out logs
	await := topology.Awaiter{Interval: 10 * time.Millisecond, Timeout: time.Second, Log: slog.New(slog.NewTextHandler(&out, nil))}

	type result struct {
		st  jetstream.Stream
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := await.Await(ctx, js, topology.BucketStream("B"))
		done <- result{st, err}
	}()
	poll.Until(t, "the missing bucket to be logged", 10*time.Second, func() bool {
		return strings.Contains(out.String(), `level=ERROR msg="bucket B is missing`)
	})
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B"}); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the wait did not end once the bucket was made")
	}
	if r.err != nil || r.st.CachedInfo().Config.Name != "KV_B" {
		t.Fatalf("Await: %v, %v; want the handle of KV_B", r.st, r.err)
	}
	if !strings.Contains(out.String(), `level=INFO msg="bucket B is there now"`) {
		t.Errorf("no word of the bucket being there:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "is missing"); n != 1 {
		t.Errorf("the missing bucket logged %d times within %s, want once:\n%s", n, topology.MissingLogEvery, out.String())
	}

	// A stream that is there is returned at once, and nothing is said.
	before := out.String()
	if err := await.AwaitAll(ctx, js, topology.BucketStream("B")); err != nil {
		t.Fatal(err)
	}
	if out.String() != before {
		t.Errorf("a stream that is there was logged: %s", strings.TrimPrefix(out.String(), before))
	}
}

// An Awaiter stops with its context's error, and with ErrConnectionClosed
// once the connection is closed for good.
func TestAwaiterStops(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	await := topology.Awaiter{Interval: 10 * time.Millisecond, Log: slog.New(slog.DiscardHandler)}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := await.AwaitAll(ctx, js, "NONE"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ctx ended: %v, want DeadlineExceeded", err)
	}

	nc.Close()
	ctx2 := ctxFor(t, 10*time.Second)
	if _, err := await.Await(ctx2, js, "NONE"); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("connection closed: %v, want ErrConnectionClosed", err)
	}
}
