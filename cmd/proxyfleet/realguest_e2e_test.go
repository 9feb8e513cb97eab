package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kdomanski/iso9660"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/config"
	"proxyfleet/messages"
)

// The real guest: a Debian 12 VM made of Debian's packages only (make
// guest-image; make testhost builds it once and caches it in .guest/),
// whose cloud-init, guest agent and proxy server (squid) are those every
// user of the distribution has. Nothing of this project's runs in it.

// debianImage is the real guest's image entry, from the test host's env.
func debianImage(t *testing.T) config.Image {
	t.Helper()
	env := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			t.Fatalf("%s is not set: run make testhost (it builds the Debian guest into .guest/)", k)
		}
		return v
	}
	return config.Image{
		Name: "proxy-debian", URL: "file://" + env("TESTHOST_DEBIAN_DISK"), SHA256: env("TESTHOST_DEBIAN_DISK_SHA256"), Format: "qcow2",
		Kernel:  &config.Artifact{URL: "file://" + env("TESTHOST_DEBIAN_KERNEL"), SHA256: env("TESTHOST_DEBIAN_KERNEL_SHA256")},
		Initrd:  &config.Artifact{URL: "file://" + env("TESTHOST_DEBIAN_INITRD"), SHA256: env("TESTHOST_DEBIAN_INITRD_SHA256")},
		Cmdline: env("TESTHOST_DEBIAN_CMDLINE"),
	}
}

// realGuestRig is a run against the test host whose proxies may boot the
// real guest: a worker and a publishing health process probing through
// the proxies into its own /probe, on host entry entry (its own, so two
// rigs at once never share a cached image or a domain).
func realGuestRig(t *testing.T, entry string, mod func(*config.Config)) (*e2e, *rotationLog) {
	t.Helper()
	rootIP := rootIP()
	img := debianImage(t)
	e := newE2E(t, func(c *config.Config) {
		c.Hosts[0].Name = entry
		c.Images = append(c.Images, img)
		// A Debian boot under TCG takes most of a minute, more on a
		// loaded machine.
		c.Worker.ReadyTimeout = 5 * time.Minute
		c.Health = config.Health{HTTP: "127.0.0.1:0", ProbeListen: rootIP + ":0", Interval: time.Second,
			Timeout: 800 * time.Millisecond, Rise: 2, Fall: 3, Grace: 30 * time.Second, Concurrency: 8, LeaseTTL: 3 * time.Second}
		if mod != nil {
			mod(c)
		}
	})
	e.worker("w1")
	e.healthHTTP = freePort(t)
	e.start("health", nil, "health", "--config", e.path, "--http", e.healthHTTP)
	return e, e.watchRotation()
}

func rootIP() string {
	if ip := os.Getenv("TESTHOST_ROOT_IP"); ip != "" {
		return ip
	}
	return "198.18.0.1"
}

// createReal publishes a create of id booting the real guest with 512 MiB
// and returns its command id.
func (e *e2e) createReal(id string) string {
	e.t.Helper()
	cmdID := fmt.Sprintf("create-%s-%d", id, time.Now().UnixNano())
	m := nats.NewMsg("proxy.cmd.create." + id)
	m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q,"image":"proxy-debian","cpus":1,"memory_mib":512}`, id))
	m.Header.Set(jetstream.MsgIDHeader, cmdID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		e.t.Fatalf("publish create %s: %v", id, err)
	}
	return cmdID
}

// check is health's record of id in PROXY_CHECKS, if there is one.
func (e *e2e) check(id string) (messages.CheckRecord, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := e.js.KeyValue(ctx, messages.BucketChecks)
	if err != nil {
		return messages.CheckRecord{}, false
	}
	ent, err := kv.Get(ctx, id)
	if err != nil {
		return messages.CheckRecord{}, false
	}
	var r messages.CheckRecord
	if json.Unmarshal(ent.Value(), &r) != nil {
		return messages.CheckRecord{}, false
	}
	return r, true
}

// seen is a request as a target in the root namespace received it.
type seen struct {
	remote string
	header http.Header
}

// recordingTarget serves on the root namespace's test address, where the
// guests reach it, and records every request: what reached the target
// through a proxy, headers and source address. It answers token.
func recordingTarget(t *testing.T, ip, token string) (u string, got func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var reqs []seen
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, seen{remote: r.RemoteAddr, header: r.Header.Clone()})
		mu.Unlock()
		io.WriteString(w, token)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/", func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), reqs...)
	}
}

// agentCommand sends one guest-agent command to domain dom through
// libvirt and returns its "return" value.
func agentCommand(t *testing.T, dom string, cmd any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Return json.RawMessage `json:"return"`
	}
	raw := virsh(t, "qemu-agent-command", dom, string(b))
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("agent answer %q: %v", raw, err)
	}
	return out.Return
}

// agentExec runs path with args in the guest through the agent
// (guest-exec) and returns its standard output.
func agentExec(t *testing.T, dom, path string, args ...string) string {
	t.Helper()
	var started struct {
		PID int `json:"pid"`
	}
	ret := agentCommand(t, dom, map[string]any{"execute": "guest-exec",
		"arguments": map[string]any{"path": path, "arg": args, "capture-output": true}})
	if err := json.Unmarshal(ret, &started); err != nil {
		t.Fatalf("guest-exec %s: %v", path, err)
	}
	var st struct {
		Exited   bool   `json:"exited"`
		ExitCode int    `json:"exitcode"`
		OutData  string `json:"out-data"`
	}
	waitUntil(t, "guest-exec "+path, 30*time.Second, func() bool {
		ret := agentCommand(t, dom, map[string]any{"execute": "guest-exec-status", "arguments": map[string]any{"pid": started.PID}})
		return json.Unmarshal(ret, &st) == nil && st.Exited
	})
	out, err := base64.StdEncoding.DecodeString(st.OutData)
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("guest-exec %s %v: exit %d, %v", path, args, st.ExitCode, err)
	}
	return string(out)
}

// seedMetaData reads meta-data from proxy id's seed volume in the test
// host's (directory) pool.
func seedMetaData(t *testing.T, e *e2e, id string) string {
	t.Helper()
	path := strings.TrimSpace(virsh(t, "vol-path", "--pool", e.cfg.Hosts[0].Pool, "pf-"+id+"-seed.iso"))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	im, err := iso9660.OpenImage(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	root, err := im.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	kids, err := root.GetChildren()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if k.Name() == "meta-data" {
			md, err := io.ReadAll(k.Reader())
			if err != nil {
				t.Fatal(err)
			}
			return string(md)
		}
	}
	t.Fatalf("no meta-data in %s", path)
	return ""
}

// TestRealGuest creates real proxies through NATS, on the stock Debian
// guest, with the default user-data (squid with the fleet's credential
// and allow-list) and, at the same time on a host entry of its own, with
// a user template that opens squid to anyone: the first is in the
// rotation and carries traffic only with the credential, revealing
// nothing; the second never enters the rotation.
func TestRealGuest(t *testing.T) {
	t.Run("authenticated", func(t *testing.T) {
		t.Parallel()
		e, rot := realGuestRig(t, "th-real", nil)
		const id = "real-auth"
		e.cleanupProxies(id)
		token := fmt.Sprintf("real-%d", time.Now().UnixNano())
		targetURL, requests := recordingTarget(t, rootIP(), token)

		start := time.Now()
		c := e.createReal(id)
		e.waitDone(6*time.Minute, c)
		running := time.Since(start)
		ev := e.lastEvent(id)
		if ev.State != messages.StateRunning || ev.IP == "" {
			t.Fatalf("last event %+v, want running with an address", ev)
		}
		waitUntil(t, id+" in the rotation", 3*time.Minute, func() bool { return rot.has(id) })
		inRotation := time.Since(start)
		t.Logf("real guest: create → running %s (source %s), → in the rotation %s",
			running.Round(100*time.Millisecond), ev.Source, inRotation.Round(100*time.Millisecond))
		addr := rot.addrs()[id]
		dom := "pf-" + id

		// Real cloud-init read the seed: the hostname it set and the
		// instance-id it recorded, read through the real agent.
		var host struct {
			HostName string `json:"host-name"`
		}
		if err := json.Unmarshal(agentCommand(t, dom, map[string]string{"execute": "guest-get-host-name"}), &host); err != nil || host.HostName != id {
			t.Errorf("hostname through the agent %q, %v; want %q (from the seed)", host.HostName, err, id)
		}
		md := seedMetaData(t, e, id)
		iid := strings.TrimSpace(agentExec(t, dom, "/bin/cat", "/var/lib/cloud/data/instance-id"))
		if iid == "" || !strings.Contains(md, `instance-id: "`+iid+`"`) {
			t.Errorf("cloud-init's instance-id %q; the seed's meta-data:\n%s", iid, md)
		}
		// The real agent knows the guest's address.
		if out := virsh(t, "domifaddr", dom, "--source", "agent"); !strings.Contains(out, ev.IP+"/") {
			t.Errorf("the agent does not list %s:\n%s", ev.IP, out)
		}

		// With the credential, a request reaches the target, from the
		// guest's address, with no header that reveals the client or
		// the proxy.
		got, err := e.through(addr, targetURL)
		if err != nil || got != token {
			t.Fatalf("through %s with the credential: %q, %v", addr, got, err)
		}
		var mine []seen
		for _, r := range requests() {
			if r.header.Get("User-Agent") != "proxyfleet-health" {
				mine = append(mine, r)
			}
		}
		if len(mine) != 1 {
			t.Fatalf("the target saw %d requests of the test's, want 1: %+v", len(mine), mine)
		}
		if h, _, _ := net.SplitHostPort(mine[0].remote); h != ev.IP {
			t.Errorf("the target saw the request come from %s, want the guest's %s", mine[0].remote, ev.IP)
		}
		for _, k := range []string{"Via", "X-Forwarded-For", "Forwarded", "Proxy-Authorization", "X-Real-Ip"} {
			if v := mine[0].header.Values(k); len(v) > 0 {
				t.Errorf("the request reached the target with %s: %q", k, v)
			}
		}
		// CONNECT with the credential, to a TLS server in the root
		// namespace.
		tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, token) }))
		ln, err := net.Listen("tcp", net.JoinHostPort(rootIP(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		tlsSrv.Listener = ln
		tlsSrv.StartTLS()
		t.Cleanup(tlsSrv.Close)
		pu := &url.URL{Scheme: "http", Host: addr, User: proxyUser(e.cfg)}
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true,
			// httptest's certificate names example.com, not the address.
			TLSClientConfig: &tls.Config{RootCAs: tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "example.com"}}}
		if resp, err := hc.Get(tlsSrv.URL); err != nil {
			t.Errorf("CONNECT through %s: %v", addr, err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != token {
				t.Errorf("CONNECT through %s: %s %q", addr, resp.Status, b)
			}
		}
		// No credential, or a wrong password: 407 both.
		for name, user := range map[string]*url.Userinfo{
			"no credential":  nil,
			"wrong password": url.UserPassword(e.cfg.Proxy.Auth.User, "not-"+e.cfg.Proxy.Auth.Password.Reveal()),
		} {
			resp, err := throughAs(addr, targetURL, user)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusProxyAuthRequired {
				t.Errorf("%s: %s, want 407", name, resp.Status)
			}
		}
		// Health found it refusing a request without the credential and
		// saw its requests come from its address: the egress.
		waitUntil(t, id+"'s check", 30*time.Second, func() bool {
			r, ok := e.check(id)
			return ok && r.Addr == addr && r.Egress != ""
		})
		if r, _ := e.check(id); r.Verdict != messages.VerdictOK || r.Egress != ev.IP {
			t.Errorf("check %+v, want verdict ok and egress %s", r, ev.IP)
		}

		d := e.command(messages.OpDelete, id)
		e.waitDone(2*time.Minute, d)
		waitUntil(t, id+" out of the rotation", 30*time.Second, func() bool { return rot.lacks(id) })
		if doms, vols := e.hostObjects(id); len(doms)+len(vols) != 0 {
			t.Errorf("after delete, on the host: domains %v, volumes %v", doms, vols)
		}
	})

	t.Run("opened by a template", func(t *testing.T) {
		t.Parallel()
		// An operator's template that ignores the credential: squid open
		// to anyone, adding no header.
		const tmpl = `#cloud-config
hostname: "{{.Hostname}}"
write_files:
- path: /etc/squid/squid.conf
  content: |
    http_port {{.Port}}
    http_access allow all
    via off
    forwarded_for delete
runcmd:
- [systemctl, enable, squid]
- [systemctl, restart, squid]
`
		e, rot := realGuestRig(t, "th-open", func(c *config.Config) { c.Proxy.UserData = tmpl })
		const id = "real-open"
		e.cleanupProxies(id)
		c := e.createReal(id)
		e.waitDone(6*time.Minute, c)
		// Health sees it answer without the credential: refused, for
		// good, with the reason.
		waitUntil(t, id+" refused as an open proxy", 3*time.Minute, func() bool {
			r, ok := e.check(id)
			return ok && r.Verdict == messages.VerdictOpen
		})
		r, _ := e.check(id)
		t.Logf("%s: %s (%s)", id, r.Verdict, r.Reason)
		// A few more probe rounds: still out.
		deadline := time.Now().Add(5 * time.Second)
		waitUntil(t, "five more seconds", 10*time.Second, func() bool { return time.Now().After(deadline) })
		if rot.everEntered(id) {
			t.Errorf("%s, an open proxy, entered the rotation", id)
		}
		// The CLI shows why.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, errOut, code := runCLI(ctx, "get", id, "--server", e.srv.ClientURL(), "--config", e.path)
		if code != 0 || !strings.Contains(out, "health:") || !strings.Contains(out, "open") {
			t.Errorf("get %s (exit %d, %s) does not say it is refused:\n%s", id, code, errOut, out)
		}
		d := e.command(messages.OpDelete, id)
		e.waitDone(2*time.Minute, d)
		if doms, vols := e.hostObjects(id); len(doms)+len(vols) != 0 {
			t.Errorf("after delete, on the host: domains %v, volumes %v", doms, vols)
		}
	})
}

// leakTemplate is a user-data template whose squid configuration depends
// on the proxy: tg-open answers anyone, tg-leaky requires the credential
// but tells the target the client's address (squid's default
// forwarded_for on), the others are as the default one. The test guest
// honours it as squid would.
const leakTemplate = `#cloud-config
hostname: "{{.Hostname}}"
write_files:
- path: /etc/squid/squid.conf
  content: |
    http_port {{.Port}}
{{- if eq .ID "tg-open"}}
    http_access allow all
    via off
    forwarded_for delete
{{- else}}
    auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/proxyfleet.passwd
    acl users proxy_auth REQUIRED
    http_access allow users
    http_access deny all
    via off
    forwarded_for {{if eq .ID "tg-leaky"}}on{{else}}delete{{end}}
- path: /etc/squid/proxyfleet.passwd
  content: |
    {{.User}}:{{.PasswordHash}}
{{- end}}
`

// TestHealthRefusesOpenAndLeakyProxies runs three test guests whose proxy
// servers are configured by a template: one as the fleet wants it enters
// the rotation with its egress address; one open to anyone and one that
// reveals the client's address never do, and say why (PROXY_CHECKS, get).
func TestHealthRefusesOpenAndLeakyProxies(t *testing.T) {
	e := newE2E(t, func(c *config.Config) {
		c.Proxy.UserData = leakTemplate
		c.Health = config.Health{HTTP: "127.0.0.1:0", ProbeListen: rootIP() + ":0", Interval: time.Second,
			Timeout: 800 * time.Millisecond, Rise: 2, Fall: 3, Grace: 30 * time.Second, Concurrency: 8, LeaseTTL: 3 * time.Second}
	})
	ids := []string{"tg-good", "tg-leaky", "tg-open"}
	e.cleanupProxies(ids...)
	e.worker("w1")
	e.healthHTTP = freePort(t)
	e.start("health", nil, "health", "--config", e.path, "--http", e.healthHTTP)
	rot := e.watchRotation()
	var cmds []string
	for _, id := range ids {
		cmds = append(cmds, e.command(messages.OpCreate, id))
	}
	e.waitDone(4*time.Minute, cmds...)
	waitUntil(t, "tg-good in the rotation", time.Minute, func() bool { return rot.has("tg-good") })
	want := map[string]string{"tg-good": messages.VerdictOK, "tg-leaky": messages.VerdictLeaky, "tg-open": messages.VerdictOpen}
	waitUntil(t, "every verdict", time.Minute, func() bool {
		for id, v := range want {
			if r, ok := e.check(id); !ok || r.Verdict != v {
				return false
			}
		}
		return true
	})
	for id := range want {
		r, _ := e.check(id)
		t.Logf("%s: %s %q, egress %s", id, r.Verdict, r.Reason, r.Egress)
	}
	if r, _ := e.check("tg-good"); r.Egress != e.lastEvent("tg-good").IP {
		t.Errorf("tg-good's egress %q, want its address %s", r.Egress, e.lastEvent("tg-good").IP)
	}
	if r, _ := e.check("tg-leaky"); !strings.Contains(r.Reason, "X-Forwarded-For") {
		t.Errorf("tg-leaky's reason %q does not name the header", r.Reason)
	}
	// More probe rounds: the refused stay out.
	deadline := time.Now().Add(5 * time.Second)
	waitUntil(t, "five more seconds", 10*time.Second, func() bool { return time.Now().After(deadline) })
	for _, id := range []string{"tg-leaky", "tg-open"} {
		if rot.everEntered(id) {
			t.Errorf("%s entered the rotation", id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, errOut, code := runCLI(ctx, "list", "--server", e.srv.ClientURL(), "--config", e.path)
	if code != 0 || !strings.Contains(out, "CHECK") || !strings.Contains(out, "leaky") || !strings.Contains(out, "open") {
		t.Errorf("list (exit %d, %s) does not show the verdicts:\n%s", code, errOut, out)
	}
}
