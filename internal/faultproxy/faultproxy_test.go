package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"proxyfleet/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every connection by echoing what it reads. It records
// how its connections ended.
type echoServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	ends []error
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_, err := io.Copy(c, c)
				s.mu.Lock()
				s.ends = append(s.ends, err)
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *echoServer) endErrors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.ends...)
}

func startProxy(t *testing.T, cfg Config) *Proxy {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back within d.
func roundTrip(c net.Conn, msg string, d time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

func TestPass(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, Config{Target: s.ln.Addr().String()})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "hello", 2*time.Second); err != nil {
		t.Fatalf("round trip through a passing proxy: %v", err)
	}
}

func TestStall_bytesStopWithoutClosing(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, Config{Target: s.ln.Addr().String()})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "before", 2*time.Second); err != nil {
		t.Fatal(err)
	}

	p.Stall()
	err := roundTrip(c, "during", 300*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip while stalled = %v, want a deadline error (no bytes, no EOF, no RST)", err)
	}
	// A connection made during the stall is accepted but carries nothing.
	c2 := dial(t, p.Addr())
	if err := roundTrip(c2, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection while stalled = %v, want a deadline error", err)
	}
	if n := len(s.endErrors()); n != 0 {
		t.Fatalf("server saw %d connection ends during a stall, want 0", n)
	}

	p.Pass()
	// The bytes held during the stall arrive now.
	if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("during"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "during" {
		t.Fatalf("held bytes after Pass = %q, %v", buf, err)
	}
	if err := roundTrip(c, "after", 2*time.Second); err != nil {
		t.Fatalf("round trip after Pass: %v", err)
	}
}

func TestReset_closesWithRSTAndNewConnectionsPass(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, Config{Target: s.ln.Addr().String()})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall() // a reset also ends a stall
	p.Reset()

	if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after Reset = %v, want ECONNRESET", err)
	}
	var ends []error
	if !poll.Wait(2*time.Second, func() bool { ends = s.endErrors(); return len(ends) == 1 }) {
		t.Fatalf("server side did not see the reset")
	}
	if !errors.Is(ends[0], syscall.ECONNRESET) {
		t.Fatalf("server side ended with %v, want ECONNRESET", ends[0])
	}

	c2 := dial(t, p.Addr())
	if err := roundTrip(c2, "again", 2*time.Second); err != nil {
		t.Fatalf("new connection after Reset: %v", err)
	}
}

func TestMaxConns_refusesBeyondBound(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, Config{Target: s.ln.Addr().String(), MaxConns: 1})
	c := dial(t, p.Addr())
	if err := roundTrip(c, "one", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, p.Addr())
	if err := c2.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("second connection over MaxConns 1: read = %v, want EOF", err)
	}
	if got := p.Conns(); got != 1 {
		t.Fatalf("Conns = %d, want 1", got)
	}
}

func TestClose_endsStalledConnections(t *testing.T) {
	s := startEcho(t)
	p, err := New(Config{Target: s.ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if err := roundTrip(c, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return with a stalled connection")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}
