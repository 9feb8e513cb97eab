package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/messages"
)

// The ban verbs: `proxyfleet ban add|ls|rm`. Requests go through package
// client (health answers them and stores the bans); the table is drawn
// here.

// banTarget checks the two positional arguments of ban add and ban rm.
func banTarget(in *invocation, verb string) (addr, site string, err error) {
	if len(in.args) != 1 {
		fmt.Fprintf(in.stderr, "usage: %s\n", usageLine(verb))
		return "", "", exitError{2}
	}
	return in.id, in.args[0], nil
}

// banAddCmd is `proxyfleet ban add ADDRESS SITE --for D`.
type banAddCmd struct {
	dur    time.Duration
	reason string
}

func (b *banAddCmd) flags(fs *flag.FlagSet) {
	fs.DurationVar(&b.dur, "for", 0, fmt.Sprintf("how long the ban lasts, from %s to %s (required)", bans.MinDuration, bans.MaxDuration))
	fs.StringVar(&b.reason, "reason", "", fmt.Sprintf("why, shown by ban ls (at most %d bytes)", bans.MaxReason))
}

func (*banAddCmd) timeout() time.Duration { return defaultTimeout }

func (b *banAddCmd) run(ctx context.Context, in *invocation) error {
	addr, site, err := banTarget(in, "ban add")
	if err != nil {
		return err
	}
	if b.dur == 0 {
		fmt.Fprintf(in.stderr, "--for is required\nusage: %s\n", usageLine("ban add"))
		return exitError{2}
	}
	cl, err := in.client()
	if err != nil {
		return err
	}
	ban, err := cl.AddBan(ctx, bans.Request{Address: addr, Site: site, For: messages.Duration(b.dur), Reason: b.reason, Source: bans.SourceCLI})
	if err != nil {
		return err
	}
	return in.output(ban, func() error {
		_, err := fmt.Fprintf(in.stdout, "banned %s for %s until %s\n", ban.Address, ban.Site, ban.Until.Local().Format(time.RFC3339))
		return err
	})
}

// banRmCmd is `proxyfleet ban rm ADDRESS SITE`.
type banRmCmd struct{}

func (*banRmCmd) flags(*flag.FlagSet)    {}
func (*banRmCmd) timeout() time.Duration { return defaultTimeout }

func (*banRmCmd) run(ctx context.Context, in *invocation) error {
	addr, site, err := banTarget(in, "ban rm")
	if err != nil {
		return err
	}
	cl, err := in.client()
	if err != nil {
		return err
	}
	if err := cl.RemoveBan(ctx, addr, site); err != nil {
		return err
	}
	lifted := struct {
		Address string `json:"address"`
		Site    string `json:"site"`
	}{addr, site}
	return in.output(lifted, func() error {
		_, err := fmt.Fprintf(in.stdout, "lifted any ban of %s for the site of %s\n", addr, site)
		return err
	})
}

// banLsCmd is `proxyfleet ban ls [--site S] [--address A]`.
type banLsCmd struct{ filter client.BanFilter }

func (b *banLsCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&b.filter.Site, "site", "", "only the bans for this site (any host of it)")
	fs.StringVar(&b.filter.Address, "address", "", "only the bans of this address")
}

func (*banLsCmd) timeout() time.Duration { return defaultTimeout }

func (b *banLsCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	bs, err := cl.Bans(ctx, b.filter)
	if err != nil {
		return err
	}
	if bs == nil {
		bs = []bans.Ban{}
	}
	return in.output(bs, func() error { return printBans(in.stdout, bs, time.Now()) })
}

// printBans writes one row per ban: its site, address, what is left of
// it, its source, who asked and why (a reason has no control characters:
// health refuses them).
func printBans(w io.Writer, bs []bans.Ban, now time.Time) error {
	tw := tab(w)
	fmt.Fprintln(tw, "SITE\tADDRESS\tLEFT\tSOURCE\tBY\tREASON")
	for _, b := range bs {
		left := max(b.Until.Sub(now), 0).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", b.Site, b.Address, left, b.Source, dashed(b.By), dashed(b.Reason))
	}
	return tw.Flush()
}
