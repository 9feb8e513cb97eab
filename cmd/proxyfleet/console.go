package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"proxyfleet/client"
	"proxyfleet/config"
	"proxyfleet/console"
)

// The console (`proxyfleet console`, or in `serve` when console.listen is
// set): package console serves the fleet in a browser, reading it and
// sending commands through package client, as the client role of NATS.

// consoleEnabled says whether the config asks for a console.
func consoleEnabled(c *config.Config) bool { return c.Console.Listen != "" }

// consoleSpec serves the console; its metrics go to env.reg, its ready
// reports whether it listens. It reads the users' password files
// (config.LoadConsoleSecrets) before it connects, so a missing or empty
// one stops the start before anything else.
func consoleSpec() *roleSpec {
	return &roleSpec{
		name: "console", inbox: inboxClient,
		configUsage: "config file (YAML); required", secrets: true,
		httpUsage: "address of /metrics, /healthz and /readyz (default from config console.http; none if empty)",
		httpAddr:  func(c *config.Config) *string { return &c.Console.HTTP },
		ops:       true,
		enabled:   consoleEnabled,
		required:  "console.listen is required for the console role",
		prepare:   (*config.Config).LoadConsoleSecrets,
		build:     buildConsole,
	}
}

func buildConsole(_ context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
	cl, err := client.New(nc, c.NATS.Prefix)
	if err != nil {
		return roleParts{}, fmt.Errorf("console: %w", err)
	}
	cc := console.Config{Listen: c.Console.Listen, ViewRefresh: c.Console.ViewRefresh, Gateways: c.Console.Gateways, Logger: env.log, Registry: env.reg}
	for _, u := range c.Console.Users {
		cc.Users = append(cc.Users, console.User{Name: u.Name, Password: u.Password.Reveal(), Admin: u.Admin})
	}
	srv, err := console.New(cl, cc)
	if err != nil {
		return roleParts{}, err
	}
	ready := func() error {
		select {
		case <-srv.Started():
			return nil
		default:
			return errors.New("console: not listening yet")
		}
	}
	return roleParts{runs: []component{{"console", srv.Run}}, ready: ready}, nil
}
