package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"proxyfleet/internal/poll"
)

func targets(n int) []Target {
	out := make([]Target, n)
	for i := range out {
		out[i] = Target{ID: fmt.Sprintf("p%03d", i), Addr: fmt.Sprintf("198.19.%d.%d:3128", i/250, i%250+1), Epoch: uint64(i + 1)}
	}
	return out
}

// A round probes every target once, never more than concurrency at a time:
// the probes are held until concurrency of them are in flight together.
func TestProbeRoundBoundsConcurrency(t *testing.T) {
	const concurrency = 16
	var inFlight, peak, calls atomic.Int64
	release := make(chan struct{})
	p := ProberFunc(func(ctx context.Context, addr string) error {
		calls.Add(1)
		n := inFlight.Add(1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		return nil
	})
	var mu sync.Mutex
	seen := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		probeRound(context.Background(), p, targets(500), concurrency, time.Minute, time.Now, func(o probeOutcome) {
			mu.Lock()
			defer mu.Unlock()
			seen[o.ID]++
			if !o.OK || o.Result != ResultOK {
				t.Errorf("%s: %+v", o.ID, o)
			}
		})
	}()
	full := poll.Wait(10*time.Second, func() bool { return inFlight.Load() >= concurrency })
	close(release)
	<-done
	if !full {
		t.Fatalf("at most %d probes in flight together, want %d", peak.Load(), concurrency)
	}
	if calls.Load() != 500 || len(seen) != 500 {
		t.Fatalf("%d probes, %d reported, want 500", calls.Load(), len(seen))
	}
	if pk := peak.Load(); pk != concurrency {
		t.Fatalf("peak concurrency %d, want %d", pk, concurrency)
	}
}

// A probe that panics is a failure of that proxy, and the others go on.
// One that hangs until its timeout fails alone: the others pass.
func TestProbeRoundPanicAndTimeoutStayPerProxy(t *testing.T) {
	tg := targets(20)
	p := ProberFunc(func(ctx context.Context, addr string) error {
		switch addr {
		case tg[3].Addr:
			panic("boom")
		case tg[7].Addr:
			<-ctx.Done() // a proxy that never answers
			return ctx.Err()
		case tg[9].Addr:
			return &ProbeError{Result: ResultBody, Err: errors.New("wrong body")}
		case tg[11].Addr:
			return errors.New("connection refused")
		}
		return nil
	})
	got := map[string]probeOutcome{}
	var mu sync.Mutex
	start := time.Now()
	probeRound(context.Background(), p, tg, 4, 50*time.Millisecond, time.Now, func(o probeOutcome) {
		mu.Lock()
		got[o.ID] = o
		mu.Unlock()
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("round took %v", d)
	}
	want := map[string]string{tg[3].ID: ResultPanic, tg[7].ID: ResultTimeout, tg[9].ID: ResultBody, tg[11].ID: ResultError}
	for _, x := range tg {
		o := got[x.ID]
		w := want[x.ID]
		if w == "" {
			w = ResultOK
		}
		if o.Result != w || o.OK != (w == ResultOK) || o.Epoch != x.Epoch || o.At.IsZero() {
			t.Errorf("%s: %+v, want %s", x.ID, o, w)
		}
	}
	if got[tg[7].ID].Latency < 50*time.Millisecond {
		t.Errorf("the hung probe took %v, less than its timeout", got[tg[7].ID].Latency)
	}
}

// A round stops handing out probes once its context is done.
func TestProbeRoundStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	p := ProberFunc(func(ctx context.Context, addr string) error {
		if calls.Add(1) == 2 {
			cancel()
		}
		<-ctx.Done()
		return ctx.Err()
	})
	probeRound(ctx, p, targets(100), 2, time.Hour, time.Now, func(probeOutcome) {})
	if n := calls.Load(); n > 5 {
		t.Fatalf("%d probes started after the cancel", n)
	}
}

func TestProbeStatsHistogram(t *testing.T) {
	s := newProbeStats()
	lat := newProbeLatency()
	for _, p := range []struct {
		r string
		d time.Duration
	}{{ResultOK, 3 * time.Millisecond}, {ResultOK, 7 * time.Millisecond}, {ResultTimeout, time.Minute}} {
		s.add(p.r)
		lat.Observe(p.d.Seconds())
	}
	var m dto.Metric
	if err := lat.Write(&m); err != nil {
		t.Fatal(err)
	}
	b := m.GetHistogram().GetBucket()
	if len(b) != len(ProbeBuckets) || b[0].GetCumulativeCount() != 1 || b[1].GetCumulativeCount() != 2 ||
		b[len(b)-1].GetCumulativeCount() != 2 || m.GetHistogram().GetSampleCount() != 3 ||
		s.results[ResultOK] != 2 || s.results[ResultTimeout] != 1 {
		t.Fatalf("stats %+v, histogram %v", s, m.GetHistogram())
	}
}
