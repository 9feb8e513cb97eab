package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"proxyfleet/client"
)

// deadLsCmd is `proxyfleet dead ls`: the dead letters in PROXY_DEAD.
type deadLsCmd struct{}

func (*deadLsCmd) flags(*flag.FlagSet)    {}
func (*deadLsCmd) timeout() time.Duration { return defaultTimeout }

func (*deadLsCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	es, err := cl.DeadLetters(ctx)
	if err != nil {
		return err
	}
	if es == nil {
		es = []client.DeadEntry{}
	}
	return in.output(es, func() error { return client.PrintDeadLetters(in.stdout, es) })
}

// deadReplayCmd is `proxyfleet dead replay ID|--all`: each proxy's latest
// dead letter published again as a new command.
type deadReplayCmd struct {
	all, force, wait bool
}

func (d *deadReplayCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&d.all, "all", false, "replay the latest dead letter of every proxy")
	fs.BoolVar(&d.force, "force", false, "replay even if the proxy has had a later command")
	fs.BoolVar(&d.wait, "wait", false, "wait for each new command's final result; exit 1 if one is rejected or failed")
}

func (d *deadReplayCmd) timeout() time.Duration {
	if d.wait {
		return 10 * time.Minute
	}
	return defaultTimeout
}

func (d *deadReplayCmd) run(ctx context.Context, in *invocation) error {
	if d.all == (in.id != "") {
		fmt.Fprintf(in.stderr, "usage: %s\n", usageLine("dead replay"))
		return exitError{2}
	}
	cl, err := in.client()
	if err != nil {
		return err
	}
	es, err := cl.DeadLetters(ctx)
	if err != nil {
		return err
	}
	// The latest dead letter of each proxy, in the order they were stored.
	latest := map[string]int{}
	for i, e := range es {
		if in.id == "" || e.ID == in.id {
			latest[e.ID] = i
		}
	}
	if len(latest) == 0 {
		if in.id != "" {
			fmt.Fprintf(in.stderr, "no dead letter of %s\n", in.id)
			return exitError{1}
		}
		fmt.Fprintln(in.stderr, "no dead letters")
		return nil
	}
	var outs []client.Outcome
	failed := false
	for i, e := range es {
		if j, ok := latest[e.ID]; !ok || j != i {
			continue
		}
		o, err := cl.Replay(ctx, e, "", d.wait, d.force)
		if errors.Is(err, client.ErrNotReplayable) {
			fmt.Fprintf(in.stderr, "skipped: %v\n", err)
			failed = true
			continue
		}
		if err != nil {
			return err
		}
		outs = append(outs, o)
		failed = failed || o.Failed()
		if !in.asJSON {
			if err := client.PrintOutcome(in.stdout, o); err != nil {
				return err
			}
		}
	}
	if in.asJSON {
		if err := client.WriteJSON(in.stdout, outs); err != nil {
			return err
		}
	}
	if failed {
		return exitError{1}
	}
	return nil
}
