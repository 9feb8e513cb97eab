package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
)

// ProxyPolicy is what the forward proxy enforces.
type ProxyPolicy struct {
	// Source is "squid.conf" when the seed's user-data configures squid, or
	// "none": an open proxy that adds no header (the guest before squid).
	Source   string
	Squid    *SquidConfig // nil when Source is "none"
	Auth     *BasicAuth   // nil without auth_param basic program
	Hostname string       // in Via and X-Cache: visible_hostname or the guest's name
}

// OpenPolicy is the policy without a squid.conf.
func OpenPolicy() *ProxyPolicy { return &ProxyPolicy{Source: "none"} }

// LoadProxyPolicy derives the policy from the seed: its user-data's
// write_files entry for /etc/squid/squid.conf and the password file that
// config names. Without a seed, user-data, a cloud-config or a squid.conf it
// is OpenPolicy, and note says why. An error means the proxy must not serve
// (a squid would not start either, or would run with rules the guest cannot
// emulate): never fall back to open then.
func LoadProxyPolicy(seed *Seed, hostname string) (pol *ProxyPolicy, note string, err error) {
	if seed == nil {
		return OpenPolicy(), "no seed", nil
	}
	if len(seed.UserData) == 0 {
		return OpenPolicy(), "no user-data", nil
	}
	cc, err := ParseCloudConfig(seed.UserData)
	if errors.Is(err, errNotCloudConfig) {
		return OpenPolicy(), err.Error(), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("user-data: %w", err)
	}
	conf, ok := cc.Files[SquidConfPath]
	if !ok {
		return OpenPolicy(), "user-data writes no " + SquidConfPath, nil
	}
	sq, err := ParseSquidConf(conf, cc.Files)
	if err != nil {
		return nil, "", err
	}
	pol = &ProxyPolicy{Source: "squid.conf", Squid: sq, Hostname: hostname}
	if sq.VisibleHostname != "" {
		pol.Hostname = sq.VisibleHostname
	}
	if pol.Hostname == "" {
		pol.Hostname = "localhost"
	}
	if sq.PasswdFile != "" {
		b, ok := cc.Files[sq.PasswdFile]
		if !ok {
			return nil, "", fmt.Errorf("squid.conf: password file %s is not in the user-data's write_files", sq.PasswdFile)
		}
		users, warnings := ParsePasswdFile(b)
		for _, w := range warnings {
			note += "; " + sq.PasswdFile + " " + w
		}
		pol.Auth = NewBasicAuth(users, sq.CaseSensitive, sq.CredentialsTTL)
	}
	note = fmt.Sprintf("auth=%t users=%d forwarded_for=%s via=%t", sq.UsesAuth(), pol.userCount(), sq.ForwardedFor, sq.Via) + note
	if len(sq.Ignored) > 0 {
		note += fmt.Sprintf("; ignored %v", sq.Ignored)
	}
	return pol, note, nil
}

func (p *ProxyPolicy) userCount() int {
	if p.Auth == nil {
		return 0
	}
	return len(p.Auth.users)
}

// ListenAddr is where the proxy listens under this policy: http_port's
// port, with its address or else the host part of fallback (-proxy-addr);
// without a squid.conf, fallback itself.
func (p *ProxyPolicy) ListenAddr(fallback string) string {
	if p.Squid == nil {
		return fallback
	}
	host := p.Squid.Host
	if host == "" {
		host, _, _ = net.SplitHostPort(fallback)
	}
	return net.JoinHostPort(host, strconv.Itoa(p.Squid.Port))
}

// ProxyService owns the proxy's listener. It listens only once Configure
// has given it a policy, so no request is served before the configuration
// is known; a configuration error keeps it closed. Start and Stop (the
// control API) work before that too: Start then means "once configured".
type ProxyService struct {
	Handler     *ProxyHandler
	DefaultAddr string // -proxy-addr
	Log         *log.Logger

	mu         sync.Mutex
	want       bool  // started, and not stopped since
	configured bool  // Configure was called
	err        error // the configuration error, if any
	pol        *ProxyPolicy
	srv        *Server
}

func (s *ProxyService) logf(format string, args ...any) {
	if s.Log != nil {
		s.Log.Printf(format, args...)
	}
}

// Configure sets the policy (or the error that keeps the proxy closed) and
// starts the listener if the proxy is wanted. It may be called again.
func (s *ProxyService) Configure(pol *ProxyPolicy, err error) error {
	s.mu.Lock()
	old := s.srv
	s.srv, s.pol, s.err, s.configured = nil, nil, err, true
	if err != nil {
		// Until old stops, its requests get 503.
		s.Handler.SetPolicy(nil)
	} else {
		s.pol = pol
		s.Handler.SetPolicy(pol)
		s.srv = &Server{Name: "proxy", Addr: pol.ListenAddr(s.DefaultAddr), Handler: s.Handler, Log: s.Log, OnStop: s.Handler.CloseTunnels}
	}
	want, srv := s.want, s.srv
	s.mu.Unlock()
	if old != nil {
		old.Stop()
	}
	if err != nil {
		s.logf("proxy: not serving (fail closed): %v", err)
		return nil
	}
	if want {
		return srv.Start()
	}
	return nil
}

// Start starts the listener, or, before Configure, marks it to start then.
func (s *ProxyService) Start() error {
	s.mu.Lock()
	s.want = true
	srv, err, configured := s.srv, s.err, s.configured
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	if !configured {
		return nil
	}
	return srv.Start()
}

// Stop closes the listener and every open connection.
func (s *ProxyService) Stop() {
	s.mu.Lock()
	s.want = false
	srv := s.srv
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Running reports whether the proxy listens.
func (s *ProxyService) Running() bool {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	return srv != nil && srv.Running()
}

// Status is the effective configuration for GET /healthz (never a
// password or a hash).
func (s *ProxyService) Status() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.configured:
		return map[string]any{"proxy_source": "pending"}
	case s.err != nil:
		return map[string]any{"proxy_source": "error", "proxy_error": s.err.Error(), "proxy_auth": false}
	}
	st := map[string]any{"proxy_source": s.pol.Source, "proxy_addr": s.srv.Addr, "proxy_auth": false}
	if _, port, err := net.SplitHostPort(s.srv.Addr); err == nil {
		if n, err := strconv.Atoi(port); err == nil {
			st["proxy_port"] = n
		}
	}
	if sq := s.pol.Squid; sq != nil {
		st["proxy_auth"] = sq.UsesAuth()
		st["proxy_forwarded_for"] = sq.ForwardedFor
		st["proxy_via"] = sq.Via
	}
	return st
}

// guestHostname is the name squid would put in Via (gethostname).
func guestHostname() string {
	h, _ := os.Hostname()
	return h
}
