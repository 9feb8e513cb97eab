package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// labelFlags collects repeated --label k=v.
type labelFlags map[string]string

func (l labelFlags) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labelFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	l[k] = val
	return nil
}

// sendFlags are the flags of the verbs that send a command.
type sendFlags struct {
	commandID string
	wait      bool
}

func (s *sendFlags) flags(fs *flag.FlagSet) {
	fs.StringVar(&s.commandID, "command-id", "", "command id (Nats-Msg-Id); default: a fresh one")
	fs.BoolVar(&s.wait, "wait", false, "wait for the final result; exit 1 if rejected or failed")
}

func (s *sendFlags) timeout() time.Duration {
	if s.wait {
		return 10 * time.Minute
	}
	return defaultTimeout
}

// send connects, sends a command through do and prints its outcome. While
// waiting (not with --json), the acceptance is told on stderr. A rejected
// or failed command exits 1.
func (s *sendFlags) send(ctx context.Context, in *invocation, do func(*client.Client) (client.Outcome, error)) error {
	var opts []client.Option
	if s.wait && !in.asJSON {
		opts = append(opts, client.WithOnResult(func(r messages.Result) {
			if r.Outcome == messages.OutcomeAccepted {
				fmt.Fprintf(in.stderr, "%s %s: accepted, command %s\n", r.Op, r.ID, r.CommandID)
			}
		}))
	}
	cl, err := in.client(opts...)
	if err != nil {
		return err
	}
	o, err := do(cl)
	if err != nil {
		return err
	}
	if err := in.output(o, func() error { return client.PrintOutcome(in.stdout, o) }); err != nil {
		return err
	}
	if o.Failed() {
		return exitError{1}
	}
	return nil
}

// createCmd is `proxyfleet create ID`: it asks for a proxy.
type createCmd struct {
	sendFlags
	host, image string
	cpus, mem   int
	labels      labelFlags
}

func (c *createCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.host, "host", "", "host to run on (default: chosen by the fleet)")
	fs.StringVar(&c.image, "image", "", "image (default: the config's default_image)")
	fs.IntVar(&c.cpus, "cpus", 0, "vCPUs (default from config)")
	fs.IntVar(&c.mem, "memory-mib", 0, "memory in MiB (default from config)")
	fs.Var(c.labels, "label", "label key=value (repeatable)")
	c.sendFlags.flags(fs)
}

func (c *createCmd) run(ctx context.Context, in *invocation) error {
	return c.send(ctx, in, func(cl *client.Client) (client.Outcome, error) {
		cmd := messages.CreateCommand{ID: in.id, Host: c.host, Image: c.image, CPUs: c.cpus, MemoryMiB: c.mem, Labels: c.labels}
		return cl.Create(ctx, cmd, c.commandID, c.wait)
	})
}

// deleteCmd is `proxyfleet delete ID`: it asks for a proxy's removal.
type deleteCmd struct{ sendFlags }

func (d *deleteCmd) run(ctx context.Context, in *invocation) error {
	return d.send(ctx, in, func(cl *client.Client) (client.Outcome, error) {
		return cl.Delete(ctx, in.id, d.commandID, d.wait)
	})
}
