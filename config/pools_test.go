package config

import (
	"testing"
	"time"

	pooldef "proxyfleet/pool/defaults"
)

func TestPoolsDefaultsAndFieldErrors(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Pools; p.Interval != pooldef.Interval || p.LeaseTTL != pooldef.LeaseTTL || p.BackoffInitial != pooldef.BackoffInitial || p.BackoffMax != pooldef.BackoffMax || p.HTTP != "" {
		t.Fatalf("pools defaults %+v", p)
	}
	c, err = Parse([]byte(good + "pools: {interval: 200ms, lease_ttl: 3s, backoff_initial: 1s, backoff_max: 10s, http: '127.0.0.1:9093'}\n"))
	if err != nil || c.Pools.Interval != 200*time.Millisecond || c.Pools.HTTP != "127.0.0.1:9093" {
		t.Fatalf("pools %+v %v", c.Pools, err)
	}
	for _, tc := range []struct{ edit, field string }{
		{"pools: {interval: -1s}\n", "pools.interval"},
		{"pools: {lease_ttl: 2m}\n", "pools.lease_ttl"},
		{"pools: {backoff_initial: -5s}\n", "pools.backoff_initial"},
		{"pools: {backoff_initial: 1m, backoff_max: 30s}\n", "pools.backoff_max"},
		{"pools: {http: nope}\n", "pools.http"},
		{"pools: {size: 3}\n", ""},
	} {
		_, err := Parse([]byte(good + tc.edit))
		if tc.field == "" {
			if err == nil {
				t.Errorf("%q: accepted an unknown key", tc.edit)
			}
			continue
		}
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != tc.field {
			t.Errorf("%q: %v, want field %s", tc.edit, err, tc.field)
		}
	}
}
