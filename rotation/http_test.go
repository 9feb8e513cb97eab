package rotation

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"proxyfleet/internal/poll"
)

// forwardProxy is an HTTP forward proxy for the test: it demands the
// fleet's credential (407 without it) and answers every proxied request
// itself, naming itself and the URL it was asked for.
func forwardProxy(t *testing.T, name, user, password string) *httptest.Server {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Proxy-Authorization") != want {
			w.Header().Set("Proxy-Authenticate", `Basic realm="fleet"`)
			http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
			return
		}
		if !req.URL.IsAbs() {
			http.Error(w, "not a proxy request", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s", name, req.URL)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestProxyFuncWithTransport: http.Transport with Proxy goes through a
// picked proxy with the credential; a session (header or context) stays on
// its proxy, labels (header or context) select, ErrEmpty fails the request.
func TestProxyFuncWithTransport(t *testing.T) {
	r := newRig(t, true)
	cfg := config(t)
	rot := r.follow(cfg)
	addrs := map[string]string{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("p%d", i)
		srv := forwardProxy(t, id, cfg.User, cfg.Password)
		addr := strings.TrimPrefix(srv.URL, "http://")
		addrs[id] = addr
		r.event(id, "h1", map[string]string{"n": fmt.Sprint(i)})
		r.put(id, addr)
	}
	labelled := func() bool {
		for id := range addrs {
			if p, ok := rot.Get(id); !ok || p.Labels == nil {
				return false
			}
		}
		return true
	}
	poll.Until(t, "3 proxies with labels", bound, labelled)

	tr := &http.Transport{Proxy: rot.Proxy}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	get := func(ctx context.Context, header map[string]string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://target.example/path", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", resp.Status, body)
		}
		via, _, _ := strings.Cut(string(body), " ")
		return via, nil
	}

	// Round robin over the three, each with the credential.
	seen := map[string]bool{}
	for range 6 {
		via, err := get(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[via] = true
	}
	if len(seen) != 3 {
		t.Fatalf("6 requests went through %v", seen)
	}

	// A session header stays on the proxy PickSession gives it.
	home, _ := rot.PickSession("alice", Selector{})
	for range 5 {
		via, err := get(context.Background(), map[string]string{HeaderSession: "alice"})
		if err != nil || via != home.ID {
			t.Fatalf("session alice via %s (%v), want %s", via, err, home.ID)
		}
	}
	// The context's session wins over the header.
	bob, _ := rot.PickSession("bob", Selector{})
	via, err := get(WithSession(context.Background(), "bob"), map[string]string{HeaderSession: "alice"})
	if err != nil || via != bob.ID {
		t.Fatalf("context session bob via %s (%v), want %s", via, err, bob.ID)
	}

	// Labels by header and by context.
	for range 3 {
		if via, err := get(context.Background(), map[string]string{HeaderLabels: "n=2"}); err != nil || via != "p2" {
			t.Fatalf("labels n=2 via %s (%v)", via, err)
		}
		if via, err := get(WithLabels(context.Background(), map[string]string{"n": "3"}), nil); err != nil || via != "p3" {
			t.Fatalf("context labels n=3 via %s (%v)", via, err)
		}
	}
	if _, err := get(context.Background(), map[string]string{HeaderLabels: "n=9"}); !errors.Is(err, ErrEmpty) {
		t.Fatalf("labels n=9: %v, want ErrEmpty", err)
	}
	if _, err := get(context.Background(), map[string]string{HeaderLabels: "junk"}); err == nil || !strings.Contains(err.Error(), HeaderLabels) {
		t.Fatalf("a bad labels header: %v", err)
	}

	// Without the credential, the proxy refuses: the test proxy checks.
	bare, err := New(r.nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if u := bare.ProxyURL(Proxy{Addr: "127.0.0.1:1"}); u.String() != "http://127.0.0.1:1" {
		t.Fatalf("ProxyURL without a credential: %s", u)
	}
	if u := rot.ProxyURL(Proxy{Addr: "127.0.0.1:1"}); u.String() != "http://fleet:secret@127.0.0.1:1" {
		t.Fatalf("ProxyURL: %s", u)
	}
	noAuth := &http.Transport{Proxy: func(req *http.Request) (u *url.URL, err error) {
		u, err = rot.Proxy(req)
		if u != nil {
			u.User = nil
		}
		return u, err
	}}
	t.Cleanup(noAuth.CloseIdleConnections)
	resp, err := (&http.Client{Transport: noAuth}).Get("http://target.example/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("without the credential: %s", resp.Status)
	}
}

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels(" a=1, b.c/d-e = x=y ,, ")
	if err != nil || !maps.Equal(got, map[string]string{"a": "1", "b.c/d-e": "x=y"}) {
		t.Fatalf("ParseLabels: %v, %v", got, err)
	}
	for _, bad := range []string{"a", "=1", "a=1,b"} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("ParseLabels(%q): no error", bad)
		}
	}
}
