package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/config"
)

// A role command (setup, worker, health, gateway, pools, console) is a
// roleSpec run by runRole; serve builds the same specs, each on its own
// connection, in one process. Both hold what they open in one lifecycle.

// roleSpecs are the role commands' specs, by command.
var roleSpecs = map[string]func() *roleSpec{
	"setup": setupSpec, "worker": workerSpec, "health": healthSpec,
	"gateway": gatewaySpec, "pools": poolsSpec, "console": consoleSpec,
}

// roleSpec is one role of the binary: its flags, how its config is read
// and checked, and how it is built on its NATS connection.
type roleSpec struct {
	// name names the flag set, the log's "role", the registry's role
	// label and the NATS client (proxyfleet-NAME, or
	// proxyfleet-serve-NAME in serve).
	name string
	// inbox is the inbox prefix of the role's NATS user.
	inbox string
	// gcPercent, if not 0, is the process's GOGC unless the environment
	// sets one (roleGC).
	gcPercent int

	// configUsage is the --config flag's; defaults, if set, is the config
	// without --config, which is otherwise required ("--config is
	// required").
	configUsage string
	defaults    func() *config.Config
	// secrets: the password files the config names are read at start
	// (config.LoadSecrets), and a missing or empty one stops the role.
	secrets bool
	// idUsage, if set, adds --id (checkID); httpUsage, if set, adds
	// --http, which sets *httpAddr(c). With ops the role command serves
	// its ops listener on that address (none if empty); without, the
	// role serves it itself. pprof adds --pprof to the ops listener.
	idUsage   string
	httpUsage string
	httpAddr  func(*config.Config) *string
	ops       bool
	pprof     bool
	// noArgs refuses positional arguments.
	noArgs bool
	// allRoles: the command runs every role (serve), so its log names
	// none; each role's log names its own.
	allRoles bool
	// flags registers the role's other flags.
	flags func(*flag.FlagSet)

	// enabled, if set, says whether the config asks for the role: serve
	// leaves it out, its own command refuses to start with required
	// (which names the settings). prepare, if set, reads what else the
	// role needs of the config's files before connecting.
	enabled  func(*config.Config) bool
	required string
	prepare  func(*config.Config) error

	// build makes the role on nc. A build that fails frees what it
	// opened; the parts of one that succeeds are run and closed by the
	// caller's lifecycle, also when a later step fails.
	build func(ctx context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error)
	// serveReady, if set, is the part of serve's /readyz the role's ready
	// makes.
	serveReady func(ready func() error) func() error
}

// roleEnv is what a role is built with besides its connection and config.
type roleEnv struct {
	id     string // --id; empty: hostname-pid
	log    *slog.Logger
	reg    *prometheus.Registry
	stdout io.Writer
	stderr io.Writer
	// ready, if set, is what else must be ready for the process to be
	// (serve's other roles, for health's /readyz).
	ready func() error
}

// roleParts is a built role.
type roleParts struct {
	// runs run the role until ctx is done, then stop (a worker drains),
	// or fail; each is a component of the process's one group, started
	// and stopped with the others. None: the role has done its work in
	// build.
	runs []component
	// ready says whether the role is ready (its /readyz); nil: always.
	ready func() error
	// stats, if set, is served at /stats on the ops listener.
	stats http.Handler
	// close, if set, frees what build opened, once every component has
	// returned (or when none ran).
	close func()
}

// roleRun is a role's command line read: its flags, log and config.
type roleRun struct {
	fs    *flag.FlagSet
	nf    *natsFlags
	log   *slog.Logger
	c     *config.Config
	id    string
	http  string
	pprof bool
}

// start reads a role's command line and config: parse the flags, make
// the logger (named by the role unless allRoles),
// set the garbage collector, read and check the config, apply --http and
// resolve the NATS settings. The URL stays empty if nothing names one.
func (s *roleSpec) start(args []string, stdout, stderr io.Writer) (*roleRun, error) {
	fs, nf, lf := roleFlags(s.name, stderr)
	cfgPath := fs.String("config", "", s.configUsage)
	var id, httpAddr string
	var withPprof bool
	if s.idUsage != "" {
		fs.StringVar(&id, "id", "", s.idUsage)
	}
	if s.httpUsage != "" {
		fs.StringVar(&httpAddr, "http", "", s.httpUsage)
	}
	if s.pprof {
		fs.BoolVar(&withPprof, "pprof", false, "also serve Go's profiles (net/http/pprof) under /debug/pprof/ on the --http listener")
	}
	if s.flags != nil {
		s.flags(fs)
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return nil, err
	}
	if s.noArgs && fs.NArg() > 0 {
		return nil, usageError(fs)
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return nil, err
	}
	if s.allRoles {
		log = log.With("pid", os.Getpid())
	} else {
		log = log.With("role", s.name, "pid", os.Getpid())
	}
	if s.gcPercent != 0 {
		roleGC(log, s.gcPercent, withPprof)
	}
	c, err := s.loadConfig(*cfgPath)
	if err != nil {
		return nil, err
	}
	if s.enabled != nil && !s.enabled(c) {
		return nil, fmt.Errorf("config %s: %s", *cfgPath, s.required)
	}
	if httpAddr != "" {
		*s.httpAddr(c) = httpAddr
	}
	if s.prepare != nil {
		if err := s.prepare(c); err != nil {
			return nil, err
		}
	}
	if err := nf.resolve(c); err != nil {
		return nil, err
	}
	r := &roleRun{fs: fs, nf: nf, log: log, c: c, id: id, pprof: withPprof}
	if s.httpAddr != nil {
		r.http = *s.httpAddr(c)
	}
	return r, nil
}

// loadConfig reads the config at path, and the secrets it names if the
// role needs them; without a path, the role's defaults.
func (s *roleSpec) loadConfig(path string) (*config.Config, error) {
	if path == "" && s.defaults != nil {
		return s.defaults(), nil
	}
	if s.secrets {
		return loadRoleConfig(path)
	}
	return loadConfig(path)
}

// runRole runs one role in this process: read its command line and
// config, connect as it, build it, serve its ops listener, then run it
// until ctx is done or a part fails, and close what it opened.
func runRole(ctx context.Context, s *roleSpec, args []string, stdout, stderr io.Writer) error {
	r, err := s.start(args, stdout, stderr)
	if err != nil {
		return err
	}
	r.nf.ensureURL()
	lc := &lifecycle{log: r.log}
	defer lc.close()
	nc, err := lc.connect(r.nf, "proxyfleet-"+s.name, s.inbox, r.log)
	if err != nil {
		return err
	}
	reg := newRegistry(s.name)
	parts, err := lc.build(ctx, s, nc, r.c, roleEnv{id: r.id, log: r.log, reg: reg, stdout: stdout, stderr: stderr})
	if err != nil || len(parts.runs) == 0 {
		return err
	}
	if s.ops && r.http != "" {
		ln, err := net.Listen("tcp", r.http)
		if err != nil {
			return fmt.Errorf("--http: %w", err)
		}
		h := roleOpsHandler(reg, parts.ready, r.pprof)
		if parts.stats != nil {
			h = withStats(h, parts.stats)
		}
		lc.add(opsComponents(ln, h, r.log)...)
	} else if r.pprof {
		return fmt.Errorf("--pprof needs an --http listener (or %s.http)", s.name)
	}
	return lc.run(ctx)
}

// lifecycle is what one process runs: its components, run together by
// run (runAll: one context, one group, the first failure stops them all),
// and what it opened (connections, providers, the embedded server),
// closed by close in the reverse order of opening, once every component
// has returned.
type lifecycle struct {
	log     *slog.Logger
	comps   []component
	closers []func()
}

// add runs cs with the others.
func (l *lifecycle) add(cs ...component) { l.comps = append(l.comps, cs...) }

// onClose closes f's part, after the parts opened after it.
func (l *lifecycle) onClose(f func()) { l.closers = append(l.closers, f) }

// connect connects as a role (natsFlags.connect), closed by close.
func (l *lifecycle) connect(nf *natsFlags, name, inbox string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nf.connect(name, inbox, log)
	if err != nil {
		return nil, err
	}
	l.onClose(nc.Close)
	return nc, nil
}

// build builds s on nc and adds it: its runs to the components, its
// close to what close closes. Its ready is never nil.
func (l *lifecycle) build(ctx context.Context, s *roleSpec, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
	p, err := s.build(ctx, nc, c, env)
	if err != nil {
		return roleParts{}, err
	}
	if p.close != nil {
		l.onClose(p.close)
	}
	l.add(p.runs...)
	if p.ready == nil {
		p.ready = func() error { return nil }
	}
	return p, nil
}

// run runs the components until ctx is done or one fails (runAll).
func (l *lifecycle) run(ctx context.Context) error { return runAll(ctx, l.log, l.comps...) }

// close closes what was opened, last first.
func (l *lifecycle) close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
	l.closers = nil
}
