package config

import (
	"errors"
	"strings"
	"testing"

	gwdef "proxyfleet/gateway/defaults"
)

// Every bound of the gateway's settings (gateway/defaults.Bounds) is
// checked when a file is read: a value just below its least and one just
// above its greatest are refused with the setting named.
func TestGatewayBoundsNameTheField(t *testing.T) {
	for _, b := range gwdef.Bounds {
		below := b.Min - 1
		if below == 0 && !b.Off {
			below = -1 // (0 asks for the default)
		}
		for _, v := range []int64{below, b.Max + 1} {
			key, field := strings.TrimPrefix(b.Path, "gateway."), b.Path
			var yml string
			if user, ok := strings.CutPrefix(key, "users[]."); ok {
				field = b.At(0)
				yml = "gateway: {listen: ':8888', users: [{name: a, password_file: /p, " + user + ": " + b.Format(v) + "}]}\n"
			} else {
				yml = "gateway: {" + key + ": " + b.Format(v) + "}\n"
			}
			_, err := Parse([]byte(good + yml))
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != field {
				t.Errorf("%s: %v, want field %s", strings.TrimSpace(yml), err, field)
			}
		}
		// The ends themselves are good.
		for _, v := range []int64{b.Min, b.Max} {
			if v == 0 && !b.Off {
				continue
			}
			key := strings.TrimPrefix(b.Path, "gateway.")
			yml := "gateway: {" + key + ": " + b.Format(v) + "}\n"
			if user, ok := strings.CutPrefix(key, "users[]."); ok {
				yml = "gateway: {listen: ':8888', users: [{name: a, password_file: /p, " + user + ": " + b.Format(v) + "}]}\n"
			}
			if b == gwdef.FirstByteTimeoutBound {
				yml = "gateway: {first_byte_timeout: " + b.Format(v) + ", response_timeout: " + gwdef.ResponseTimeoutBound.Format(gwdef.ResponseTimeoutBound.Max) + "}\n"
			}
			if _, err := Parse([]byte(good + yml)); err != nil {
				t.Errorf("%s: %v", strings.TrimSpace(yml), err)
			}
		}
	}
}

// gateway.retries: 0 turns retries off, and retry_body_bytes: 0 the
// holding of bodies to send again; absent, each is its default.
func TestGatewayZeroTurnsOff(t *testing.T) {
	c, err := Parse([]byte(good + "gateway: {retries: 0, retry_body_bytes: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *c.Gateway.Retries != 0 || *c.Gateway.RetryBodyBytes != 0 {
		t.Fatalf("retries: 0 read as %d, retry_body_bytes: 0 as %d", *c.Gateway.Retries, *c.Gateway.RetryBodyBytes)
	}
	if c, err = Parse([]byte(good)); err != nil {
		t.Fatal(err)
	}
	if *c.Gateway.Retries != gwdef.Retries || *c.Gateway.RetryBodyBytes != gwdef.RetryBodyBytes {
		t.Fatalf("absent: retries %d, retry_body_bytes %d, want the defaults", *c.Gateway.Retries, *c.Gateway.RetryBodyBytes)
	}
}
