package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/proxy"
)

// echoTarget is a target that writes back what it reads.
func echoTarget(t *testing.T) string {
	return serveAddr(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// closedByPeer waits (up to a hang bound) for c to be closed by the
// gateway: a read that ends in EOF or a reset, not in the bound. It
// returns how many bytes came before.
func closedByPeer(t *testing.T, c net.Conn, r io.Reader) int64 {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	n, err := io.Copy(io.Discard, r)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the gateway kept an idle connection open")
	}
	return n
}

// TestIdleTunnelClosed: a CONNECT or SOCKS5 tunnel that carries no byte
// either way for IdleTimeout is closed; one that carries bytes (one
// way is enough) stays open.
func TestIdleTunnelClosed(t *testing.T) {
	_, pk := fleet(t, 1)
	const idle = time.Second
	g := startGateway(t, pk, func(c *Config) { c.IdleTimeout = idle })
	echo := echoTarget(t)
	open := map[string]func(t *testing.T) (net.Conn, io.Reader){
		"connect": func(t *testing.T) (net.Conn, io.Reader) {
			resp, c, br := g.connect(t, echo, basic("alice", alicePass), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			return c, br
		},
		"socks": func(t *testing.T) (net.Conn, io.Reader) {
			c, err := socksDial(t, g, &proxy.Auth{User: "alice", Password: alicePass}, echo)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c, c
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			c, r := open(t)
			br := bufio.NewReader(r)
			// Bytes every tenth of IdleTimeout, for three of them: open.
			for i := range 30 {
				if _, err := io.WriteString(c, "ping\n"); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
					t.Fatalf("echo %d: %q %v", i, line, err)
				}
				time.Sleep(idle / 10)
			}
			// Then nothing: closed.
			closedByPeer(t, c, br)
		})
	}
}

// TestIdleRequestBodyClosed: a request whose body stops coming for
// IdleTimeout is not answered and its connection is closed, on both
// HTTP paths.
func TestIdleRequestBodyClosed(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, func(c *Config) { c.IdleTimeout = 500 * time.Millisecond })
	tg := newTarget(t, false)
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			c, err := net.Dial("tcp", g.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var pad string
			if path == "large head" {
				pad = "X-Pad: " + strings.Repeat("p", 9<<10) + "\r\n"
			}
			// 100 bytes announced, 10 sent.
			req := "POST " + tg.srv.URL + "/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: " + basic("alice", alicePass) +
				"\r\n" + pad + "Content-Length: 100\r\n\r\n0123456789"
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			if n := closedByPeer(t, c, c); n != 0 {
				t.Fatalf("%d bytes of an answer to a request whose body never came", n)
			}
		})
	}
}
