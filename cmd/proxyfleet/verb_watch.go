package main

import (
	"context"
	"errors"
	"flag"
	"time"

	"proxyfleet/client"
)

// watchCmd is `proxyfleet watch`: state events live, as a table on a
// terminal, as lines otherwise, or as JSON. It ends without error when its
// --timeout or a signal ends it.
type watchCmd struct{ refresh time.Duration }

func (w *watchCmd) flags(fs *flag.FlagSet) {
	fs.DurationVar(&w.refresh, "refresh", time.Second, "redraw at most this often")
}

func (*watchCmd) timeout() time.Duration { return 0 }

func (w *watchCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	var opts []client.WatchOption
	if in.asJSON {
		opts = append(opts, client.WithWatchMode(client.WatchJSON))
	}
	wt, err := cl.Watch(ctx)
	if err == nil {
		err = client.PrintWatch(in.stdout, wt, w.refresh, opts...)
		wt.Stop()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}
