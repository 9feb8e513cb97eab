package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/client"
	"proxyfleet/config"
	"proxyfleet/console"
)

// The console (`proxyfleet console`, or in `serve` when console.listen is
// set): package console serves the fleet in a browser, reading it and
// sending commands through package client, as the client role of NATS.

// consoleEnabled says whether the config asks for a console.
func consoleEnabled(c *config.Config) bool { return c.Console.Listen != "" }

// consoleComponent serves the console on nc; its metrics go to reg. ready
// reports whether it listens. The caller has read the users' password
// files (config.LoadConsoleSecrets) before it connected, so a missing or
// empty one stops the start before anything else.
func consoleComponent(nc *nats.Conn, c *config.Config, log *slog.Logger, reg prometheus.Registerer) (comp component, ready func() error, err error) {
	cl, err := client.New(nc, c.NATS.Prefix)
	if err != nil {
		return component{}, nil, fmt.Errorf("console: %w", err)
	}
	cc := console.Config{Listen: c.Console.Listen, Logger: log, Registry: reg}
	for _, u := range c.Console.Users {
		cc.Users = append(cc.Users, console.User{Name: u.Name, Password: u.Password.Reveal(), Admin: u.Admin})
	}
	srv, err := console.New(cl, cc)
	if err != nil {
		return component{}, nil, err
	}
	ready = func() error {
		select {
		case <-srv.Started():
			return nil
		default:
			return errors.New("console: not listening yet")
		}
	}
	return component{"console", srv.Run}, ready, nil
}

// runConsole runs the console role alone.
func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, nf, lf := roleFlags("console", stderr)
	cfgPath := fs.String("config", "", "config file (YAML); required")
	httpAddr := fs.String("http", "", "address of /metrics, /healthz and /readyz (default from config console.http; none if empty)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	log = log.With("role", "console", "pid", os.Getpid())
	c, err := loadRoleConfig(*cfgPath)
	if err != nil {
		return err
	}
	if !consoleEnabled(c) {
		return fmt.Errorf("config %s: console.listen is required for the console role", *cfgPath)
	}
	if *httpAddr != "" {
		c.Console.HTTP = *httpAddr
	}
	if err := c.LoadConsoleSecrets(); err != nil {
		return err
	}
	if err := nf.resolve(c); err != nil {
		return err
	}
	nf.ensureURL()
	nc, err := nf.connect("proxyfleet-console", inboxClient, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry("console")
	k, ready, err := consoleComponent(nc, c, log, reg)
	if err != nil {
		return err
	}
	comps := []component{k}
	if c.Console.HTTP != "" {
		ln, err := net.Listen("tcp", c.Console.HTTP)
		if err != nil {
			return fmt.Errorf("--http: %w", err)
		}
		comps = append(comps, opsComponent(ln, roleOpsHandler(reg, ready, false), log))
	}
	return runAll(ctx, log, comps...)
}
