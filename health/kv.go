package health

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"proxyfleet/messages"
)

// bucketWriters bounds the puts and deletes of PROXY_ROTATION in flight
// while publishing: each is a request the server stores (and, with
// sync_always, fsyncs) before it answers, so one at a time costs a round
// trip and a disk write per changed proxy.
const bucketWriters = 32

// kvPut is one key of PROXY_ROTATION to write.
type kvPut struct{ id, addr string }

// bucketWrites returns what brings PROXY_ROTATION from what the loop
// believes it holds (h.bucket) to the addresses of changes: a put for a
// proxy that entered or whose address changed, a delete for one that
// left. O(changes).
func (h *Health) bucketWrites(changes []change) (puts []kvPut, dels []string) {
	for _, c := range changes {
		have, ok := h.bucket[c.id]
		switch {
		case c.op == messages.ChangeLeft:
			if ok {
				dels = append(dels, c.id)
			}
		case !ok || have != c.e.Addr:
			puts = append(puts, kvPut{c.id, c.e.Addr})
		}
	}
	return puts, dels
}

// reconcileWrites returns what brings PROXY_ROTATION, as just read into
// h.bucket, to want (id → address): O(fleet), once after taking the lease
// or a failure, never per change.
func (h *Health) reconcileWrites(want map[string]string) (puts []kvPut, dels []string) {
	for id, addr := range want {
		if have, ok := h.bucket[id]; !ok || have != addr {
			puts = append(puts, kvPut{id, addr})
		}
	}
	for id := range h.bucket {
		if _, ok := want[id]; !ok {
			dels = append(dels, id)
		}
	}
	return puts, dels
}

// writeBucket makes puts and dels in PROXY_ROTATION, at most bucketWriters
// at a time, and records in h.bucket what was written. Keys are
// independent: no key is both put and deleted, so their order does not
// matter; the feed's message goes out only after all of them are stored.
func (h *Health) writeBucket(puts []kvPut, dels []string, opCtx func() (context.Context, context.CancelFunc)) error {
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(bucketWriters)
	for _, p := range puts {
		g.Go(func() error {
			octx, cancel := opCtx()
			_, err := h.kv.PutString(octx, p.id, p.addr)
			cancel()
			if err != nil {
				return fmt.Errorf("put %s in %s: %w", p.id, messages.BucketRotation, err)
			}
			mu.Lock()
			h.bucket[p.id] = p.addr
			mu.Unlock()
			return nil
		})
	}
	for _, key := range dels {
		g.Go(func() error {
			octx, cancel := opCtx()
			err := h.kv.Delete(octx, key)
			cancel()
			if err != nil {
				return fmt.Errorf("delete %s from %s: %w", key, messages.BucketRotation, err)
			}
			mu.Lock()
			delete(h.bucket, key)
			mu.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// readBucket returns every key and value of PROXY_ROTATION.
func (h *Health) readBucket(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string)
	err := h.readKV(ctx, h.kv, messages.BucketRotation, func(key string, value []byte) { out[key] = string(value) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readKV calls put with every key and value of the bucket kv (named name).
func (h *Health) readKV(ctx context.Context, kv jetstream.KeyValue, name string, put func(key string, value []byte)) error {
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	w, err := kv.WatchAll(octx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	defer w.Stop()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil
			}
			put(e.Key(), e.Value())
		case <-octx.Done():
			return fmt.Errorf("read %s: %w", name, octx.Err())
		}
	}
}
