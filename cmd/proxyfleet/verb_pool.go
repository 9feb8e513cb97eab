package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// The pool verbs: `proxyfleet pool set|get|ls|rm|recycle`. Commands go
// through package client; the tables are drawn here.

// hostFlags collects repeated --host h.
type hostFlags []string

func (h *hostFlags) String() string { return strings.Join(*h, ",") }
func (h *hostFlags) Set(v string) error {
	*h = append(*h, v)
	return nil
}

// poolSetCmd is `proxyfleet pool set NAME`: create a pool or replace its
// whole spec.
type poolSetCmd struct {
	sendFlags
	size, minReady, surge int
	recycleAfterBans      int
	maxAge, readyTimeout  time.Duration
	image                 string
	cpus, mem             int
	labels                labelFlags
	hosts                 hostFlags
}

func (p *poolSetCmd) flags(fs *flag.FlagSet) {
	fs.IntVar(&p.size, "size", -1, "members to keep in the rotation (required)")
	fs.IntVar(&p.minReady, "min-ready", -1, "recycling never takes the pool's members in the rotation below this (default: size)")
	fs.IntVar(&p.surge, "surge", -1, "members made beyond size at once to replace old ones (default 1)")
	fs.DurationVar(&p.maxAge, "max-age", 0, "replace a member older than this (less up to 10% jitter), make-before-break (default: never)")
	fs.DurationVar(&p.readyTimeout, "ready-timeout", 0, "replace a member out of the rotation this long (default 5m)")
	fs.IntVar(&p.recycleAfterBans, "recycle-after-bans", 0, "replace a member whose egress addresses are banned on this many sites at once, make-before-break, to fresh addresses (default 0: never)")
	fs.StringVar(&p.image, "image", "", "the members' image (default: the config's default_image)")
	fs.IntVar(&p.cpus, "cpus", 0, "the members' vCPUs (default from config)")
	fs.IntVar(&p.mem, "memory-mib", 0, "the members' memory in MiB (default from config)")
	fs.Var(p.labels, "label", "a label key=value of every member, besides pool=NAME (repeatable)")
	fs.Var(&p.hosts, "host", "a host the members may go to (repeatable; default: any)")
	p.sendFlags.flags(fs)
}

func (p *poolSetCmd) run(ctx context.Context, in *invocation) error {
	if p.size < 0 {
		fmt.Fprintf(in.stderr, "--size is required\nusage: %s\n", usageLine("pool set"))
		return exitError{2}
	}
	cmd := messages.PoolSet{Name: in.id, Size: p.size, MaxAge: messages.Duration(p.maxAge), ReadyTimeout: messages.Duration(p.readyTimeout),
		RecycleAfterBans: p.recycleAfterBans, Spec: messages.PoolSpec{Image: p.image, CPUs: p.cpus, MemoryMiB: p.mem, Hosts: p.hosts}}
	if len(p.labels) > 0 {
		cmd.Spec.Labels = p.labels
	}
	if p.minReady >= 0 {
		cmd.MinReady = &p.minReady
	}
	if p.surge >= 0 {
		cmd.Surge = &p.surge
	}
	return p.send(ctx, in, func(cl *client.Client) (client.Outcome, error) { return cl.PoolSet(ctx, cmd, p.commandID, p.wait) })
}

// poolRmCmd is `proxyfleet pool rm NAME`: delete a pool and its members.
type poolRmCmd struct{ sendFlags }

func (p *poolRmCmd) run(ctx context.Context, in *invocation) error {
	return p.send(ctx, in, func(cl *client.Client) (client.Outcome, error) { return cl.PoolDelete(ctx, in.id, p.commandID, p.wait) })
}

// poolRecycleCmd is `proxyfleet pool recycle NAME (ID... | --all)`.
type poolRecycleCmd struct {
	sendFlags
	all bool
}

func (p *poolRecycleCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&p.all, "all", false, "recycle every member")
	p.sendFlags.flags(fs)
}

func (p *poolRecycleCmd) run(ctx context.Context, in *invocation) error {
	if p.all == (len(in.args) > 0) {
		fmt.Fprintf(in.stderr, "usage: %s\n", usageLine("pool recycle"))
		return exitError{2}
	}
	cmd := messages.PoolRecycle{Name: in.id, IDs: in.args, All: p.all}
	return p.send(ctx, in, func(cl *client.Client) (client.Outcome, error) { return cl.PoolRecycle(ctx, cmd, p.commandID, p.wait) })
}

// poolLsCmd is `proxyfleet pool ls`.
type poolLsCmd struct{}

func (*poolLsCmd) flags(*flag.FlagSet)    {}
func (*poolLsCmd) timeout() time.Duration { return defaultTimeout }

func (*poolLsCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	pools, err := cl.Pools(ctx)
	if err != nil {
		return err
	}
	return in.output(pools, func() error { return printPools(in.stdout, pools, time.Now()) })
}

// poolGetCmd is `proxyfleet pool get NAME`.
type poolGetCmd struct{}

func (*poolGetCmd) flags(*flag.FlagSet)    {}
func (*poolGetCmd) timeout() time.Duration { return defaultTimeout }

func (*poolGetCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	st, err := cl.Pool(ctx, in.id)
	if err != nil {
		return err
	}
	return in.output(st, func() error { return printPool(in.stdout, st, time.Now()) })
}

func tab(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printPools writes one row per pool: its size, its members by state, the
// age of its oldest, its state and, when degraded, why.
func printPools(w io.Writer, pools []client.PoolStatus, now time.Time) error {
	tw := tab(w)
	fmt.Fprintln(tw, "NAME\tSIZE\tREADY\tCREATING\tRECYCLING\tBANNED\tRETIRING\tOLDEST\tSTATE\tREASON")
	for _, p := range pools {
		s, r := p.Summary, p.Record
		reason := ""
		if r.State == messages.PoolDegraded {
			reason = oneLineReason(r.Reason)
		}
		banned := "-" // recycle_after_bans off
		if r.RecycleAfterBans > 0 {
			banned = fmt.Sprint(s.Banned)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t%s\n", r.Name, r.Size, s.Ready, s.Creating, s.Recycling, banned, s.Retiring,
			client.Age(now, s.Oldest), dashed(r.State), dashed(reason))
	}
	return tw.Flush()
}

// printPool writes a pool's settings, then one row per member.
func printPool(w io.Writer, p client.PoolStatus, now time.Time) error {
	r, s := p.Record, p.Summary
	tw := tab(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("name", r.Name)
	row("state", fmt.Sprintf("%s (for %s)", dashed(r.State), client.Age(now, r.StateSince)))
	if r.Reason != "" {
		row("reason", oneLineReason(r.Reason))
	}
	row("size", fmt.Sprintf("%d (min_ready %d, surge %d)", r.Size, r.MinReady, r.Surge))
	maxAge := "never"
	if r.MaxAge > 0 {
		maxAge = r.MaxAge.D().String()
	}
	row("max_age", maxAge)
	row("ready_timeout", r.ReadyTimeout.D().String())
	recycleBans := "never recycled for them (recycle_after_bans 0)"
	if r.RecycleAfterBans > 0 {
		recycleBans = fmt.Sprintf("a member banned on %d sites at once is replaced (recycle_after_bans)", r.RecycleAfterBans)
	}
	row("bans", recycleBans)
	spec := r.Spec
	image := spec.Image
	if image == "" {
		image = "- (the config's default_image)"
	}
	row("image", image)
	if spec.CPUs > 0 || spec.MemoryMiB > 0 {
		row("size of each", fmt.Sprintf("%d vCPU, %d MiB", spec.CPUs, spec.MemoryMiB))
	}
	if len(spec.Labels) > 0 {
		row("labels", formatLabelMap(spec.Labels))
	}
	if len(spec.Hosts) > 0 {
		row("hosts", strings.Join(spec.Hosts, ", "))
	}
	members := fmt.Sprintf("%d ready, %d creating, %d recycling, %d retiring", s.Ready, s.Creating, s.Recycling, s.Retiring)
	if s.Banned > 0 {
		members = fmt.Sprintf("%d ready, %d creating, %d recycling (%d for their bans), %d retiring", s.Ready, s.Creating, s.Recycling, s.Banned, s.Retiring)
	}
	row("members", members)
	if r.Failures > 0 {
		row("failures", fmt.Sprintf("%d since a member last entered the rotation (last %s ago)", r.Failures, client.Age(now, r.LastFailure)))
	}
	row("command", fmt.Sprintf("%s %s (sequence %d)", r.Op, r.CommandID, r.Seq))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Members) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tab(w)
	fmt.Fprintln(tw, "ID\tHOST\tAGE\tROTATION\tSTATE\tREASON")
	for _, m := range r.Members {
		in := "out"
		if p.InRotation[m.ID] {
			in = "in"
		}
		state, reason := "live", ""
		due, why := r.Due(m, now)
		switch {
		case m.Retired != nil:
			state, reason = "retiring ("+m.Retired.Why+")", m.Retired.Reason
		case due:
			state, reason = "recycling", why
		case m.Ready.IsZero() && !p.InRotation[m.ID]:
			state = "creating"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Host, client.Age(now, m.Created), in, state, dashed(oneLineReason(reason)))
	}
	return tw.Flush()
}

func oneLineReason(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

func formatLabelMap(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
