package hostshare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Owner is who owns a host as the server sees it.
type Owner struct {
	// Pin is the pinned client id of the host's work consumer; "" when it
	// is pinned to nobody (no worker pulls it, or none has been given work
	// since the last one let go).
	Pin string
	// Worker is the id of the worker whose record in PROXY_WORKERS
	// publishes that pin; "" when none does (yet).
	Worker string
}

// Owners returns the owner of each of hosts from the server's side: the
// client its work consumer is pinned to, named by the worker record that
// holds that pin. A host whose consumer does not exist is absent.
func Owners(ctx context.Context, js jetstream.JetStream, hosts []string) (map[string]Owner, error) {
	byPin := map[string]string{}
	recs, err := WorkerRecords(ctx, js)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		for _, pin := range r.Pins {
			byPin[pin] = r.ID
		}
	}
	out := map[string]Owner{}
	for _, h := range hosts {
		cons, err := js.Consumer(ctx, messages.StreamWork, topology.WorkConsumer(h))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", topology.WorkConsumer(h), err)
		}
		o := Owner{Pin: pinnedTo(cons)}
		if o.Pin != "" {
			o.Worker = byPin[o.Pin]
		}
		out[h] = o
	}
	return out, nil
}

// WorkerRecords reads every record of PROXY_WORKERS, live or not (see
// messages.WorkerRecord; a record's At says when it was last renewed).
func WorkerRecords(ctx context.Context, js jetstream.JetStream) ([]messages.WorkerRecord, error) {
	kv, err := js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", messages.BucketWorkers, err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list bucket %s: %w", messages.BucketWorkers, err)
	}
	var out []messages.WorkerRecord
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			_ = keys.Stop()
			return nil, fmt.Errorf("read worker %s: %w", k, err)
		}
		var r messages.WorkerRecord
		if json.Unmarshal(e.Value(), &r) == nil {
			out = append(out, r)
		}
	}
	return out, nil
}
