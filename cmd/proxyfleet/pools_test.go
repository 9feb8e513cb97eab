package main

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// withPool makes a pool of one on r's serve and waits until serve's
// /metrics shows it: the pool controller's per-pool families exist only
// for pools.
func withPool(t *testing.T, r *roles) {
	t.Helper()
	nc, err := nats.Connect("nats://" + r.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := client.New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o, err := cl.PoolSet(ctx, messages.PoolSet{Name: "m", Size: 1}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool set m --size 1 --wait: %+v %v", o, err)
	}
	waitUntil(t, "serve's /metrics to show pool m", 30*time.Second, func() bool {
		mfs := scrape(t, r.serve)
		return value(mfs, "proxyfleet_pool_members", "pool", "m", "state", "ready") == 1 &&
			value(mfs, "proxyfleet_pool_creates_total", "pool", "m") == 1 && value(mfs, "proxyfleet_pool_active") == 1
	})
}
