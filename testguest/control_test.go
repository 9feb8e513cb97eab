package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type fakeSwitch struct {
	on  bool
	err error
}

func (f *fakeSwitch) Start() error {
	if f.err != nil {
		return f.err
	}
	f.on = true
	return nil
}
func (f *fakeSwitch) Stop()         { f.on = false }
func (f *fakeSwitch) Running() bool { return f.on }

func do(t *testing.T, h http.Handler, method, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestControlAPI(t *testing.T) {
	seeds := &SeedStore{}
	proxy, agent := &fakeSwitch{on: true}, &fakeSwitch{on: true}
	h := ControlHandler(seeds, proxy, agent)

	if code, _ := do(t, h, "GET", "/instance-id"); code != 503 {
		t.Fatalf("instance-id before seed: %d", code)
	}
	seeds.Set(&Seed{InstanceID: "i-42", LocalHostname: "h", MetaDataRaw: []byte("instance-id: i-42\n"), UserData: []byte("#cloud-config\n")}, nil)
	if code, body := do(t, h, "GET", "/instance-id"); code != 200 || body != "i-42" {
		t.Fatalf("instance-id: %d %q", code, body)
	}
	if _, body := do(t, h, "GET", "/meta-data"); body != "instance-id: i-42\n" {
		t.Fatalf("meta-data %q", body)
	}
	if _, body := do(t, h, "GET", "/user-data"); body != "#cloud-config\n" {
		t.Fatalf("user-data %q", body)
	}
	if code, _ := do(t, h, "GET", "/proxy/stop"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /proxy/stop: %d", code)
	}
	if _, body := do(t, h, "POST", "/proxy/stop"); body != "stopped\n" || proxy.on {
		t.Fatalf("proxy/stop %q", body)
	}
	if _, body := do(t, h, "POST", "/agent/stop"); body != "stopped\n" || agent.on {
		t.Fatalf("agent/stop %q", body)
	}
	_, body := do(t, h, "GET", "/healthz")
	var st map[string]any
	json.Unmarshal([]byte(body), &st)
	if st["proxy"] != false || st["agent"] != false || st["instance_id"] != "i-42" {
		t.Fatalf("healthz %s", body)
	}
	do(t, h, "POST", "/proxy/start")
	do(t, h, "POST", "/agent/start")
	if !proxy.on || !agent.on {
		t.Fatal("not restarted")
	}
	proxy.err = errors.New("address in use")
	proxy.on = false
	if code, body := do(t, h, "POST", "/proxy/start"); code != 500 || !strings.Contains(body, "address in use") {
		t.Fatalf("failing start: %d %q", code, body)
	}
}

func TestControlHealthzProxyConfig(t *testing.T) {
	hash := bcryptHash(t, "s3cret")
	ps := &ProxyService{Handler: NewProxyHandler(discardLogger()), DefaultAddr: "127.0.0.1:0", Log: discardLogger()}
	h := ControlHandler(&SeedStore{}, ps, &fakeSwitch{})
	health := func() map[string]any {
		_, body := do(t, h, "GET", "/healthz")
		if strings.Contains(body, hash) || strings.Contains(body, "s3cret") || strings.Contains(body, "$2a$") {
			t.Fatalf("healthz shows a secret: %s", body)
		}
		var st map[string]any
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := health(); st["proxy_source"] != "pending" || st["proxy"] != false {
		t.Fatalf("before the config: %v", st)
	}
	pol, _, err := LoadProxyPolicy(&Seed{UserData: []byte(exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), hash))}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	ps.Configure(pol, nil)
	st := health()
	// JSON numbers decode as float64.
	if st["proxy_source"] != "squid.conf" || st["proxy_auth"] != true || st["proxy_port"] != float64(3128) ||
		st["proxy_forwarded_for"] != "delete" || st["proxy_via"] != false {
		t.Fatalf("squid.conf: %v", st)
	}
	ps.Configure(OpenPolicy(), nil)
	if st := health(); st["proxy_source"] != "none" || st["proxy_auth"] != false || st["proxy_addr"] != "127.0.0.1:0" {
		t.Fatalf("open: %v", st)
	}
}

func TestControlHealthzNetwork(t *testing.T) {
	ns := &NetStatus{}
	h := ControlHandler(&SeedStore{}, &fakeSwitch{}, &fakeSwitch{}, ns)
	health := func() map[string]any {
		_, body := do(t, h, "GET", "/healthz")
		var st map[string]any
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := health(); st["network"] != "pending" {
		t.Fatalf("before: %v", st)
	}
	ns.Set("dhcp", "eth0", "", nil, errors.New("network-config: no ethernets entry matches eth0"))
	if st := health(); st["network"] != "dhcp" || st["network_interface"] != "eth0" || !strings.Contains(st["network_error"].(string), "no ethernets entry") {
		t.Fatalf("dhcp: %v", st)
	}
}
