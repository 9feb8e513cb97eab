package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lmittmann/tint"
)

const usage = `proxyfleet runs a fleet of proxy VMs on KVM hosts, driven by NATS.

Usage:
  proxyfleet serve    [--config F] [--data-dir D] [--listen ADDR] [--nats-url URL] [--http ADDR] [--repair]
  proxyfleet setup    [--config F] [--nats-url URL] [--repair [--interval 5s]]
  proxyfleet worker   --config F [--nats-url URL]
  proxyfleet health   [--config F] [--nats-url URL] [--http ADDR]
  proxyfleet create   ID [--host H] [--image I] [--cpus N] [--memory-mib M] [--label k=v] [--command-id C] [--wait]
  proxyfleet delete   ID [--command-id C] [--wait]
  proxyfleet get      ID
  proxyfleet list
  proxyfleet watch
  proxyfleet rotation [--http URL]
  proxyfleet hosts

Every command takes --nats-url (default nats://127.0.0.1:4222), --creds,
--tls-ca, --tls-cert, --tls-key and --prefix; "proxyfleet CMD -h" lists all.
`

// exitError carries a process exit code.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	// SIGINT or SIGTERM stops (a worker drains); a second one exits at once.
	ctx, stop := signalContext(os.Stderr)
	err := run(ctx, os.Args[1], os.Args[2:], os.Stdout, os.Stderr)
	stop()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	default:
		fmt.Fprintf(os.Stderr, "proxyfleet %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "setup":
		return setup(ctx, args, stdout, stderr)
	case "worker":
		return runWorker(ctx, args, stderr)
	case "health":
		return runHealth(ctx, args, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		if v, ok := findVerb(cmd); ok {
			return runVerb(ctx, v, args, stdout, stderr)
		}
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", cmd, usage)
		return exitError{2}
	}
}

// newLogger logs through tint on a terminal and as JSON otherwise.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
		}
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
