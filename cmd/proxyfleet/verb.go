package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/client"
	"proxyfleet/config"
)

// verb is one of the client verbs: the name it is called by, whether it
// takes a proxy ID, what its --timeout means, and a fresh command to hold
// one run's flags.
type verb struct {
	name       string
	id         bool // takes exactly one proxy ID
	optionalID bool // takes at most one (the command checks the rest)
	more       bool // takes one ID (a pool's name) and any number more (in.args)
	timeout    string
	new        func() command
}

// The --timeout texts: each says what the verb does with it.
const (
	timeoutSend  = "give up after this long (default 10m with --wait, 10s otherwise)"
	timeoutRead  = "give up after this long (default 10s)"
	timeoutWatch = "stop watching after this long (default: never)"
)

// command is one run of a verb: its own flags (their help is its help) and
// what it does with them. runVerb adds the flags every verb shares.
type command interface {
	// flags registers the verb's own flags.
	flags(fs *flag.FlagSet)
	// timeout is the default of --timeout; zero means none.
	timeout() time.Duration
	// run does the verb's work once the flags are parsed.
	run(ctx context.Context, in *invocation) error
}

// verbs are the client verbs, dispatched by run.
var verbs = []verb{
	{name: "create", id: true, timeout: timeoutSend, new: func() command { return &createCmd{labels: labelFlags{}} }},
	{name: "delete", id: true, timeout: timeoutSend, new: func() command { return &deleteCmd{} }},
	{name: "get", id: true, timeout: timeoutRead, new: func() command { return &getCmd{} }},
	{name: "list", timeout: timeoutRead, new: func() command { return &listCmd{} }},
	{name: "watch", timeout: timeoutWatch, new: func() command { return &watchCmd{} }},
	{name: "rotation", timeout: timeoutRead, new: func() command { return &rotationCmd{} }},
	{name: "hosts", timeout: timeoutRead, new: func() command { return &hostsCmd{} }},
	{name: "addresses", optionalID: true, timeout: timeoutRead, new: func() command { return &addressesCmd{} }},
	{name: "dead ls", timeout: timeoutRead, new: func() command { return &deadLsCmd{} }},
	{name: "dead replay", optionalID: true, timeout: timeoutSend, new: func() command { return &deadReplayCmd{} }},
	// Pools (verb_pool.go): the ID is the pool's name.
	{name: "pool set", id: true, timeout: timeoutSend, new: func() command { return &poolSetCmd{labels: labelFlags{}} }},
	{name: "pool get", id: true, timeout: timeoutRead, new: func() command { return &poolGetCmd{} }},
	{name: "pool ls", timeout: timeoutRead, new: func() command { return &poolLsCmd{} }},
	{name: "pool rm", id: true, timeout: timeoutSend, new: func() command { return &poolRmCmd{} }},
	{name: "pool recycle", more: true, timeout: timeoutSend, new: func() command { return &poolRecycleCmd{} }},
	// Hosts (verb_host.go): the ID is the host's name.
	{name: "host quarantine", id: true, timeout: timeoutSend, new: func() command { return &hostQuarantineCmd{} }},
	{name: "host release", id: true, timeout: timeoutSend, new: func() command { return &hostReleaseCmd{} }},
	// Bans (verb_ban.go): the ID is the address, the one argument more
	// the site.
	{name: "ban add", more: true, timeout: timeoutRead, new: func() command { return &banAddCmd{} }},
	{name: "ban ls", timeout: timeoutRead, new: func() command { return &banLsCmd{} }},
	{name: "ban rm", more: true, timeout: timeoutRead, new: func() command { return &banRmCmd{} }},
}

// findVerb returns the client verb called name.
func findVerb(name string) (verb, bool) {
	for _, v := range verbs {
		if v.name == name {
			return v, true
		}
	}
	return verb{}, false
}

// defaultTimeout bounds a verb that does not wait for a command's outcome.
const defaultTimeout = 10 * time.Second

// invocation is what every verb's run shares: its proxy ID, --json, the
// NATS settings, the outputs, and the connection once made.
type invocation struct {
	id             string   // the proxy ID, for verbs that take one
	args           []string // the positional arguments after the ID, for verbs that take more
	asJSON         bool
	nats           natsFlags
	stdout, stderr io.Writer
	nc             *nats.Conn
}

// client connects to NATS and returns a client on the connection, which
// runVerb closes when the verb returns.
func (in *invocation) client(opts ...client.Option) (*client.Client, error) {
	nc, err := in.nats.connect("proxyfleet-cli", inboxClient, nil)
	if err != nil {
		return nil, err
	}
	in.nc = nc
	return client.New(nc, in.nats.prefix, opts...)
}

// output writes v as JSON with --json, and calls text otherwise.
func (in *invocation) output(v any, text func() error) error {
	if in.asJSON {
		return client.WriteJSON(in.stdout, v)
	}
	return text()
}

// runVerb parses the flags every verb shares (NATS, --config, --json,
// --timeout) and the verb's own, which may come after the ID
// (proxyfleet create p1 --wait), then runs the verb under its timeout. A
// usage error exits 2.
func runVerb(ctx context.Context, v verb, args []string, stdout, stderr io.Writer) error {
	cmd := v.new()
	fs := newFlags(v.name, stderr)
	in := &invocation{stdout: stdout, stderr: stderr}
	in.nats.register(fs)
	cfgPath := fs.String("config", "", "config file, for the NATS settings (optional)")
	fs.BoolVar(&in.asJSON, "json", false, "print JSON")
	timeout := fs.Duration("timeout", 0, v.timeout)
	cmd.flags(fs)
	var pos []string
	rest := args
	for {
		if err := parseFlags(fs, rest, stdout); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case v.id && len(pos) != 1, v.optionalID && len(pos) > 1, v.more && len(pos) < 1,
		!v.id && !v.optionalID && !v.more && len(pos) != 0:
		fmt.Fprintf(stderr, "usage: %s\n", usageLine(v.name))
		return exitError{2}
	case len(pos) >= 1:
		in.id, in.args = pos[0], pos[1:]
	}
	var c *config.Config
	if *cfgPath != "" {
		var err error
		if c, err = loadConfig(*cfgPath); err != nil {
			return err
		}
	}
	if err := in.nats.resolve(c); err != nil {
		return err
	}
	in.nats.ensureURL()
	if *timeout <= 0 {
		*timeout = cmd.timeout()
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	defer func() {
		if in.nc != nil {
			in.nc.Close()
		}
	}()
	return cmd.run(ctx, in)
}
