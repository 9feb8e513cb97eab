package main

import (
	"strings"
	"testing"

	"proxyfleet/config"
	gwdef "proxyfleet/gateway/defaults"
)

// Every bounded key of gateway: reaches gateway.Config as the file says
// (each at the greatest value its bound allows, or 0 for the settings a
// 0 turns off), and the gateway takes the result.
func TestGatewayOptions_everyBoundIsMapped(t *testing.T) {
	want := map[string]int64{}
	var keys []string
	for _, b := range gwdef.Bounds {
		v := b.Max
		if b.Off {
			v = 0
		}
		want[b.At(0)] = v
		if k, ok := strings.CutPrefix(b.Path, "gateway."); ok && !strings.Contains(k, "[]") {
			keys = append(keys, k+": "+b.Format(v))
		}
	}
	c, err := config.Parse([]byte(`
hosts: [{name: s, driver: sim, sim: {dir: /tmp/x}}]
gateway:
  listen: 127.0.0.1:0
  users: [{name: a, password_file: /p, max_conns: ` + gwdef.MaxConnsBound.Format(gwdef.MaxConnsBound.Max) + `}]
  ` + strings.Join(keys, "\n  ") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	gc := gatewayConfig(c)
	gc.Users[0].Password = "p"
	gc = gc.WithDefaults()
	if err := gc.Validate(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{
		"gateway.retries":             int64(gc.Retries),
		"gateway.connect_timeout":     int64(gc.ConnectTimeout),
		"gateway.response_timeout":    int64(gc.ResponseTimeout),
		"gateway.first_byte_timeout":  int64(gc.FirstByteTimeout),
		"gateway.retry_after":         int64(gc.RetryAfter),
		"gateway.drain_timeout":       int64(gc.DrainTimeout),
		"gateway.handshake_timeout":   int64(gc.HandshakeTimeout),
		"gateway.header_timeout":      int64(gc.HeaderTimeout),
		"gateway.keepalive_timeout":   int64(gc.KeepAliveTimeout),
		"gateway.idle_timeout":        int64(gc.IdleTimeout),
		"gateway.users[0].max_conns":  int64(gc.Users[0].MaxConns),
		"gateway.auth_failures":       int64(gc.AuthFailures),
		"gateway.max_header_bytes":    int64(gc.MaxHeaderBytes),
		"gateway.max_header_fields":   int64(gc.MaxHeaderFields),
		"gateway.max_unauthenticated": int64(gc.MaxUnauthenticated),
		"gateway.body_peek":           int64(gc.BodyPeek),
		"gateway.retry_body_bytes":    int64(gc.RetryBodyBytes),
	}
	for path, v := range want {
		if g, ok := got[path]; !ok || g != v {
			t.Errorf("%s: the gateway has %d (known %t), the file says %d", path, g, ok, v)
		}
	}
}
