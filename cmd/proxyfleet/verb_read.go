package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"time"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// getCmd is `proxyfleet get ID`: one proxy's state; a proxy that is not
// known exits 1.
type getCmd struct{}

func (*getCmd) flags(*flag.FlagSet)    {}
func (*getCmd) timeout() time.Duration { return defaultTimeout }

func (*getCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	st, err := cl.Get(ctx, in.id)
	if errors.Is(err, client.ErrNotFound) {
		fmt.Fprintf(in.stderr, "proxy %s: not found\n", in.id)
		return exitError{1}
	}
	if err != nil {
		return err
	}
	return in.output(st, func() error { return client.PrintStatus(in.stdout, st) })
}

// listCmd is `proxyfleet list`: the fleet's proxies, all or those that
// pass its filters, a page at a time if asked.
type listCmd struct {
	all         bool
	host, state string
	labels      labelFlags
	after       string
	limit       int
}

func (l *listCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&l.all, "all", false, "include deleted proxies")
	fs.StringVar(&l.host, "host", "", "only the proxies on this host")
	fs.StringVar(&l.state, "state", "", "only the proxies in this state (provisioning, running, failed, deleting, deleted, pending)")
	l.labels = labelFlags{}
	fs.Var(l.labels, "label", "only the proxies labelled `KEY=VALUE` (repeat: all must hold)")
	fs.StringVar(&l.after, "after", "", "only the proxies whose ids sort after this one (the next page starts after the last id of a page)")
	fs.IntVar(&l.limit, "limit", 0, "at most this many proxies (0: all); with more left, a line on stderr says where the next page starts")
}

func (*listCmd) timeout() time.Duration { return defaultTimeout }

func (l *listCmd) run(ctx context.Context, in *invocation) error {
	if l.limit < 0 {
		fmt.Fprintf(in.stderr, "list: --limit %d: want 0 (all) or more\n", l.limit)
		return exitError{2}
	}
	switch l.state {
	case "", messages.StateProvisioning, messages.StateRunning, messages.StateFailed, messages.StateDeleting, messages.StateDeleted, "pending":
	default:
		fmt.Fprintf(in.stderr, "list: --state %q: want provisioning, running, failed, deleting, deleted or pending\n", l.state)
		return exitError{2}
	}
	cl, err := in.client()
	if err != nil {
		return err
	}
	opts := []client.ListOption{client.OnHost(l.host), client.InState(l.state), client.Page(l.after, 0)}
	if l.all || l.state == messages.StateDeleted {
		opts = append(opts, client.IncludeDeleted())
	}
	for k, v := range l.labels {
		opts = append(opts, client.WithLabel(k, v))
	}
	sts, err := cl.List(ctx, opts...)
	if err != nil {
		return err
	}
	if l.limit > 0 && len(sts) > l.limit {
		sts = sts[:l.limit]
		fmt.Fprintf(in.stderr, "more proxies: the next page is --after %s\n", sts[len(sts)-1].ID)
	}
	return in.output(sts, func() error { return client.PrintStatusTable(in.stdout, sts) })
}

// rotationCmd is `proxyfleet rotation`: the proxies clients may use, as
// the publishing health process has them (its pages and feed; the KV
// bucket when none answers), or from a health process's HTTP side.
type rotationCmd struct{ httpURL string }

func (r *rotationCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.httpURL, "http", "", "read from a health process's HTTP address (e.g. http://127.0.0.1:8080) instead of over NATS")
}

func (*rotationCmd) timeout() time.Duration { return defaultTimeout }

func (r *rotationCmd) run(ctx context.Context, in *invocation) error {
	var (
		rot messages.Rotation
		err error
	)
	var cl *client.Client
	if r.httpURL != "" {
		rot, err = client.RotationURL(ctx, http.DefaultClient, r.httpURL)
	} else if cl, err = in.client(); err == nil {
		rot, err = cl.Rotation(ctx)
	}
	if err != nil {
		return err
	}
	return in.output(rot, func() error {
		if err := client.PrintRotation(in.stdout, rot); err != nil || cl == nil {
			return err
		}
		// The bans, over NATS only: a count, `ban ls` lists them.
		bs, err := cl.Bans(ctx, client.BanFilter{})
		if err != nil {
			fmt.Fprintf(in.stderr, "bans: not read: %v\n", err)
			return nil
		}
		_, err = fmt.Fprintf(in.stdout, "%d active bans (proxyfleet ban ls)\n", len(bs))
		return err
	})
}
