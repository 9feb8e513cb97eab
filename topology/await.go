package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MissingLogEvery is how often a role waiting for a stream or bucket that
// set-up has not made (or a repairer has not made again) says, at error
// level, that it is still missing.
const MissingLogEvery = 30 * time.Second

// Awaiter waits for the streams and buckets set-up makes: a role that
// needs one waits for it and never creates it.
type Awaiter struct {
	// Interval is how long it waits between two lookups of a stream;
	// required.
	Interval time.Duration
	// Timeout bounds one lookup; 0: only the context given to Await does.
	Timeout time.Duration
	// Log is where it says what is missing; nil: slog.Default().
	Log *slog.Logger
	// Now is the clock of the waits it reports; nil: time.Now.
	Now func() time.Time
}

// Await waits until stream name exists (a bucket's: BucketStream(bucket))
// and returns its handle, looking every Interval. While it is missing, it
// says so at error level, at once and again every MissingLogEvery, and any
// other failure of a lookup at warn level; once the stream is there after
// it was missing, it says at info level how long it waited. It fails with
// ctx's error, wrapped, when ctx ends, and with nats.ErrConnectionClosed,
// wrapped, once js's connection is closed for good.
func (a Awaiter) Await(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	log := a.Log
	if log == nil {
		log = slog.Default()
	}
	now := a.Now
	if now == nil {
		now = time.Now
	}
	what := describe(name)
	var since, logged time.Time
	for {
		st, err := a.lookup(ctx, js, name)
		if err == nil {
			if !since.IsZero() {
				log.Info(what+" is there now", "waited", now().Sub(since).Round(time.Millisecond))
			}
			return st, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for %s: %w", what, ctx.Err())
		}
		if js.Conn().IsClosed() {
			return nil, fmt.Errorf("wait for %s: %w", what, nats.ErrConnectionClosed)
		}
		t := now()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if since.IsZero() {
				since = t
			}
			if logged.IsZero() || t.Sub(logged) >= MissingLogEvery {
				log.Error(what+" is missing: waiting for set-up to create it (`proxyfleet setup`, or `serve`)",
					"waited", t.Sub(since).Round(time.Millisecond))
				logged = t
			}
		} else {
			log.Warn("look up "+what, "err", err)
		}
		timer := time.NewTimer(a.Interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-timer.C:
		}
	}
}

// AwaitAll is Await of each of names in turn.
func (a Awaiter) AwaitAll(ctx context.Context, js jetstream.JetStream, names ...string) error {
	for _, name := range names {
		if _, err := a.Await(ctx, js, name); err != nil {
			return err
		}
	}
	return nil
}

func (a Awaiter) lookup(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	if a.Timeout <= 0 {
		return js.Stream(ctx, name)
	}
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()
	return js.Stream(ctx, name)
}

// describe names stream name as logs and errors do: "bucket B" for the
// stream behind bucket B, "stream S" for another.
func describe(name string) string {
	if b, ok := strings.CutPrefix(name, "KV_"); ok {
		return "bucket " + b
	}
	return "stream " + name
}
