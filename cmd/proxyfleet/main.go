package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

const usage = `proxyfleet runs a fleet of proxy VMs on KVM hosts, driven by NATS.

Usage:
  proxyfleet serve    --config F [--data-dir D] [--listen ADDR] [--server URL] [--http ADDR] [--repair] [--id ID]
  proxyfleet setup    [--config F] [--repair [--interval 5s]]
  proxyfleet worker   --config F [--id ID] [--http ADDR] [--pprof]
  proxyfleet health   [--config F] [--http ADDR]
  proxyfleet gateway  --config F [--http ADDR] [--pprof]
  proxyfleet pools    --config F [--id ID] [--http ADDR]
  proxyfleet console  --config F [--http ADDR]
  proxyfleet create   ID [--host H] [--image I] [--cpus N] [--memory-mib M] [--label k=v] [--command-id C] [--wait]
  proxyfleet delete   ID [--command-id C] [--wait]
  proxyfleet get      ID
  proxyfleet list     [--all] [--host H] [--state S] [--label k=v]... [--after ID] [--limit N]
  proxyfleet watch    [--refresh 1s]
  proxyfleet rotation [--http URL]
  proxyfleet hosts
  proxyfleet addresses [HOST]
  proxyfleet host     quarantine HOST [--reason R] [--wait]
  proxyfleet host     release HOST [--wait]
  proxyfleet dead     ls | replay (ID | --all) [--force] [--wait]
  proxyfleet pool     set NAME --size N [--min-ready N] [--surge N] [--max-age D] [--label k=v] [--host H] [--wait]
  proxyfleet pool     get NAME
  proxyfleet pool     ls [--json]
  proxyfleet pool     rm NAME [--wait]
  proxyfleet pool     recycle NAME (ID... | --all) [--wait]
  proxyfleet ban     add ADDRESS SITE --for D [--reason R]
  proxyfleet ban     ls [--site S] [--address A]
  proxyfleet ban     rm ADDRESS SITE
  proxyfleet version
  proxyfleet completion bash|zsh

Every command connects as the nats CLI does: --server/-s (or NATS_URL),
--context (or NATS_CONTEXT, or the selected nats context), --creds, --nkey,
--user/--password, --tlscert, --tlskey, --tlsca, and takes --prefix. A flag
wins over its environment variable, which wins over the context, then the
config file, then the default nats://127.0.0.1:4222. Roles take --log-level
and --log-format. "proxyfleet CMD --help" tells more.
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
	err := dispatch(ctx, cmd, args, stdout, stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

func dispatch(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	switch cmd {
	case "serve":
		return serve(ctx, args, stdout, stderr)
	case "setup", "worker", "health", "gateway", "pools", "console":
		return runRole(ctx, roleSpecs[cmd](), args, stdout, stderr)
	case "dead", "pool", "ban", "host":
		if len(args) > 0 {
			if v, ok := findVerb(cmd + " " + args[0]); ok {
				return runVerb(ctx, v, args[1:], stdout, stderr)
			}
		}
		fs := newFlags(cmd, stderr)
		if err := parseFlags(fs, args, stdout); err != nil {
			return err
		}
		return usageError(fs)
	case "version":
		return version(args, stdout, stderr)
	case "completion":
		return completion(args, stdout, stderr)
	case "help", "-h", "--help":
		// "help help" and "help --help" ask for this same usage; passing
		// them on would ask for it again without end.
		if len(args) > 0 && args[0] != "help" && args[0] != "-h" && args[0] != "--help" {
			return dispatch(ctx, args[0], append(args[1:len(args):len(args)], "--help"), stdout, stderr)
		}
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
