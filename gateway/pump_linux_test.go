package gateway

import (
	"bytes"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// TestTunnelIdleAfterBulk: a tunnel that carried bulk bytes both ways
// (spliced through pipes) and went quiet holds no more descriptors than
// it did after a byte each way: its pipes went back to their pool, and
// the pool's drop closes them. The tunnel still carries bytes after.
func TestTunnelIdleAfterBulk(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	resp, c, br := g.connect(t, echoTarget(t), basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a bound for hangs only
	echo := func(n int) {
		t.Helper()
		sent := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		werr := make(chan error, 1)
		go func() {
			_, err := c.Write(sent)
			werr <- err
		}()
		got := make([]byte, n)
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatalf("%d bytes back: %v", n, err)
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, sent) {
			t.Fatalf("%d bytes came back changed", n)
		}
	}
	fds := func() int {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	echo(1)
	quiet := fds()
	echo(8 << 20)
	poll.Until(t, "the bulk bytes' pipes to be closed", 10*time.Second, func() bool {
		runtime.GC()
		return fds() <= quiet
	})
	echo(1)
}
