package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// HostInfo is one host as `proxyfleet hosts` shows it.
type HostInfo struct {
	Host string `json:"host"`
	// Owner is the worker that holds the host's work (its heartbeat in
	// PROXY_WORKERS lists the host as owned); empty when none says so.
	Owner string `json:"owner"`
	// Proxies hold room on the host, against MaxProxies (0: unknown, no
	// worker has recorded the host yet).
	Proxies    int `json:"proxies"`
	MaxProxies int `json:"max_proxies"`
	// State is ok, quarantined (its calls kept failing: placement skips
	// it and its work waits) or draining (its owner is stopping), Since
	// when it became so.
	State string    `json:"state"`
	Since time.Time `json:"since,omitzero"`
	// Until ends a quarantine's cool-down, when the owner probes the host
	// again; Reason is the failure that keeps it quarantined.
	Until  time.Time `json:"until,omitzero"`
	Reason string    `json:"reason,omitempty"`
}

// Hosts reads every host's record in PROXY_HOSTS (room and quarantine)
// and the worker heartbeats in PROXY_WORKERS (owners, draining), sorted by
// host. A host only a heartbeat names is listed with what it says. A
// missing PROXY_WORKERS (set-up older than the fleet work) leaves every
// owner empty.
func (c *Client) Hosts(ctx context.Context) ([]HostInfo, error) {
	byHost := map[string]*HostInfo{}
	info := func(h string) *HostInfo {
		if byHost[h] == nil {
			byHost[h] = &HostInfo{Host: h, State: messages.HostOK}
		}
		return byHost[h]
	}
	kv, err := c.bucket(ctx, messages.BucketHosts)
	if err != nil {
		return nil, err
	}
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		var rec messages.HostRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			return nil // not ours to show
		}
		hi := info(e.Key())
		hi.Proxies, hi.MaxProxies, hi.Since = len(rec.Proxies), rec.MaxProxies, rec.Since
		if rec.Quarantined() {
			hi.State, hi.Until, hi.Reason = messages.HostQuarantined, rec.Until, rec.Reason
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketHosts, err)
	}
	workers, err := c.workers(ctx)
	if err != nil {
		return nil, err
	}
	// The newest heartbeat that owns a host names its owner.
	sort.Slice(workers, func(i, j int) bool { return workers[i].At.Before(workers[j].At) })
	for _, wr := range workers {
		for _, h := range wr.Hosts {
			info(h)
		}
		for _, h := range wr.Owned {
			hi := info(h)
			hi.Owner = wr.ID
			if wr.State == messages.WorkerDraining && hi.State != messages.HostQuarantined {
				hi.State, hi.Since = messages.HostDraining, wr.At
			}
		}
	}
	out := make([]HostInfo, 0, len(byHost))
	for _, h := range slices.Sorted(maps.Keys(byHost)) {
		out = append(out, *byHost[h])
	}
	return out, nil
}

// workers reads the heartbeats in PROXY_WORKERS.
func (c *Client) workers(ctx context.Context) ([]messages.WorkerRecord, error) {
	kv, err := c.js.KeyValue(ctx, messages.BucketWorkers)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", messages.BucketWorkers, err)
	}
	var out []messages.WorkerRecord
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		var wr messages.WorkerRecord
		if json.Unmarshal(e.Value(), &wr) == nil {
			if wr.ID == "" {
				wr.ID = e.Key()
			}
			out = append(out, wr)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketWorkers, err)
	}
	return out, nil
}

// HostColumns are the columns of PrintHosts.
var HostColumns = []string{"HOST", "OWNER", "PROXIES", "STATE", "SINCE", "REASON"}

// PrintHosts writes one row per host: its owning worker, its proxies
// against its max_proxies, its state, how long it has been so, and for a
// quarantined host when it is probed next (or that only a release ends an
// operator's quarantine) and why it is quarantined.
func PrintHosts(w io.Writer, hosts []HostInfo) error {
	return printHosts(w, hosts, time.Now())
}

func printHosts(w io.Writer, hosts []HostInfo, now time.Time) error {
	tw := newTab(w)
	fmt.Fprintln(tw, strings.Join(HostColumns, "\t"))
	for _, h := range hosts {
		room := "-"
		if h.MaxProxies > 0 {
			room = fmt.Sprintf("%d/%d", h.Proxies, h.MaxProxies)
		}
		reason := h.Reason
		if h.State == messages.HostQuarantined && h.Until.IsZero() {
			reason = "until released: " + reason // an operator's: no probe ends it
		} else if h.State == messages.HostQuarantined {
			next := "probe due"
			if d := h.Until.Sub(now); d > 0 {
				next = "probe in " + d.Round(time.Second).String()
			}
			reason = next + ": " + reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Host, dash(h.Owner), room, h.State, Age(now, h.Since), dash(oneLine(reason)))
	}
	return tw.Flush()
}

// HostRecords reads every host's record in PROXY_HOSTS as stored (room,
// quarantine, address plan and assignments), sorted by host; with hosts,
// only theirs.
func (c *Client) HostRecords(ctx context.Context, hosts ...string) ([]messages.HostRecord, error) {
	kv, err := c.bucket(ctx, messages.BucketHosts)
	if err != nil {
		return nil, err
	}
	var out []messages.HostRecord
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		if len(hosts) > 0 && !slices.Contains(hosts, e.Key()) {
			return nil
		}
		var rec messages.HostRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			return nil // not ours to show
		}
		rec.Host = e.Key()
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketHosts, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}
