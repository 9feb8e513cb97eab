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

// listCmd is `proxyfleet list`: the fleet's proxies.
type listCmd struct{ all bool }

func (l *listCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&l.all, "all", false, "include deleted proxies")
}

func (*listCmd) timeout() time.Duration { return defaultTimeout }

func (l *listCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	var opts []client.ListOption
	if l.all {
		opts = append(opts, client.IncludeDeleted())
	}
	sts, err := cl.List(ctx, opts...)
	if err != nil {
		return err
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
	if r.httpURL != "" {
		rot, err = client.RotationURL(ctx, http.DefaultClient, r.httpURL)
	} else {
		var cl *client.Client
		if cl, err = in.client(); err == nil {
			rot, err = cl.Rotation(ctx)
		}
	}
	if err != nil {
		return err
	}
	return in.output(rot, func() error { return client.PrintRotation(in.stdout, rot) })
}
