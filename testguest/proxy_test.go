package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func newProxy(t *testing.T) (*httptest.Server, *ProxyHandler) {
	t.Helper()
	ph := NewProxyHandler(discardLogger())
	ph.SetPolicy(OpenPolicy())
	s := httptest.NewServer(ph)
	t.Cleanup(func() { ph.CloseTunnels(); s.Close() })
	return s, ph
}

func TestProxyForwardsAbsoluteGET(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Connection") != "" || r.Header.Get("Proxy-Authorization") != "" {
			t.Errorf("hop-by-hop header forwarded: %v", r.Header)
		}
		w.Header().Set("X-Origin", "yes")
		fmt.Fprintf(w, "hello %s %s", r.Method, r.URL.Path)
	}))
	defer origin.Close()
	p, _ := newProxy(t)
	pu, _ := url.Parse(p.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", origin.URL+"/x/y", nil)
	req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "hello GET /x/y" || resp.Header.Get("X-Origin") != "yes" {
		t.Fatalf("%d %q %v", resp.StatusCode, b, resp.Header)
	}
}

func TestProxyRejectsOriginFormAndBadGateway(t *testing.T) {
	p, _ := newProxy(t)
	resp, err := http.Get(p.URL + "/not-absolute")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// A closed port behind the proxy: 502.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	pu, _ := url.Parse(p.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	resp, err = c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestProxyCONNECTTunnels(t *testing.T) {
	// An echo server that upper-cases lines.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintln(c, strings.ToUpper(sc.Text()))
				}
			}()
		}
	}()
	p, ph := newProxy(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// Send the request head and the first tunnel bytes in one write.
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nfirst\n", ln.Addr(), ln.Addr())
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	line, _ := br.ReadString('\n')
	if line != "FIRST\n" {
		t.Fatalf("got %q", line)
	}
	fmt.Fprintln(c, "second")
	if line, _ = br.ReadString('\n'); line != "SECOND\n" {
		t.Fatalf("got %q", line)
	}
	// Stopping the proxy closes open tunnels.
	ph.CloseTunnels()
	if _, err := br.ReadString('\n'); err == nil {
		t.Fatal("tunnel still open after CloseTunnels")
	}
}

func TestServerStopStart(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{Name: "t", Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	for i := 0; i < 2; i++ {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if !s.Running() {
			t.Fatal("not running")
		}
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s.Stop()
		if s.Running() {
			t.Fatal("still running")
		}
		if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			t.Fatal("still listening after Stop")
		}
	}
}

func TestProxyAddsNoContentType(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		io.WriteString(w, "<html>no type</html>")
	}))
	defer origin.Close()
	p, _ := newProxy(t)
	pu, _ := url.Parse(p.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	resp, err := c.Get(origin.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v, ok := resp.Header["Content-Type"]; ok {
		t.Fatalf("proxy added Content-Type %q", v)
	}
}
