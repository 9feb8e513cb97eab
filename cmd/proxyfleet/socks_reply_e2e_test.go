package main

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// dialE2E connects to addr, with a deadline a minute away.
func dialE2E(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	return c
}

// socksReply asks the SOCKS5 server at addr, as user, to connect to
// host:port (the domain form) and returns its reply code.
func socksReply(t *testing.T, addr, user, pw, host string, port int) byte {
	t.Helper()
	c := dialE2E(t, addr)
	defer c.Close()
	msg := []byte{5, 1, 2}
	msg = append(msg, 1, byte(len(user)))
	msg = append(msg, user...)
	msg = append(msg, byte(len(pw)))
	msg = append(msg, pw...)
	msg = append(msg, 5, 1, 0, 3, byte(len(host)))
	msg = append(msg, host...)
	msg = binary.BigEndian.AppendUint16(msg, uint16(port))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	// Method choice (2), auth status (2), then the reply's first two.
	var b [6]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatalf("SOCKS5 %s:%d: %v", host, port, err)
	}
	if b[1] != 2 || b[3] != 0 {
		t.Fatalf("SOCKS5 handshake: %v", b)
	}
	return b[5]
}

// squidAnswer sends CONNECT target to the proxy at addr with the fleet's
// credential and returns squid's answer: its status line, its header
// fields as net/http writes them (canonical names, sorted) and its body.
func squidAnswer(t *testing.T, addr, auth, target string) string {
	t.Helper()
	c := dialE2E(t, addr)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", target, target, auth)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "HTTP/%d.%d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.Status)
	_ = resp.Header.Write(&sb)
	sb.WriteString("\r\n")
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	sb.Write(body)
	return sb.String()
}

// socksDenied is an address of the test network nothing uses, in the
// guests' proxy.deny of TestGatewayOverRealProxies: squid refuses it
// before it connects anywhere.
const socksDenied = "198.19.255.254"

// socksRepliesFromRealSquid: what a real squid (a Debian guest's, proxy
// id's fleet) answers a CONNECT it refuses, and the SOCKS5 reply a gateway
// makes of it: a destination proxy.deny lists, and a name that resolves
// onto the guest itself, 2 (not allowed by ruleset); a port that refuses
// the connection, 5 (refused). The gateway, one of its own with its
// default timeouts, denies nothing itself (gateway.deny: []), so squid
// decides. With PROXYFLEET_RECORD_SQUID set to a directory, squid's
// answers are written there (gateway/testdata/squid holds them).
func socksRepliesFromRealSquid(t *testing.T, e *e2e, rot *rotationLog, id string) {
	const denied = socksDenied
	socksAddr := freePort(t)
	c := *e.cfg
	none := []string{}
	c.Gateway.Listen, c.Gateway.SocksListen, c.Gateway.Deny = freePort(t), socksAddr, &none
	c.Gateway.ConnectTimeout, c.Gateway.ResponseTimeout = 0, 0
	b, err := yaml.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.dir, "config-socks.yaml")
	writeFile(t, path, string(b))
	// Started under t: it is stopped when t ends.
	e.start("gateway-socks", nil, "gateway", "--config", path, "--http", freePort(t), "--debug")

	// A port on the test host that refuses connections.
	ln, err := net.Listen("tcp", net.JoinHostPort(rootIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	cases := []struct {
		name, host string
		port       int
		want       byte
	}{
		{"denied", denied, 443, 2},
		{"guest", "localhost", 443, 2},
		{"refused", rootIP(), closedPort, 5},
	}
	// The gateway listens once it has started and serves once it has read
	// the rotation.
	waitUntil(t, "the gateway's SOCKS5 listener", time.Minute, func() bool {
		c, err := net.DialTimeout("tcp", socksAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	waitUntil(t, "the gateway to carry a SOCKS5 request", time.Minute, func() bool {
		return socksReply(t, socksAddr, "alice", "alice-gateway-secret", cases[0].host, cases[0].port) != 3
	})
	for _, c := range cases {
		if got := socksReply(t, socksAddr, "alice", "alice-gateway-secret", c.host, c.port); got != c.want {
			t.Errorf("SOCKS5 %s (%s:%d): reply %d, want %d", c.name, c.host, c.port, got, c.want)
		}
	}

	if dir := os.Getenv("PROXYFLEET_RECORD_SQUID"); dir != "" {
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(e.cfg.Proxy.Auth.User+":"+e.cfg.Proxy.Auth.Password.Reveal()))
		addr := rot.addrs()[id]
		for _, c := range cases {
			ans := squidAnswer(t, addr, auth, net.JoinHostPort(c.host, strconv.Itoa(c.port)))
			writeFile(t, filepath.Join(dir, c.name+".txt"), ans)
		}
	}
}
