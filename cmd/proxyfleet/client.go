package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
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

// clientVerb runs create, delete, get, list, watch and rotation.
func clientVerb(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nf natsFlags
	nf.register(fs, "")
	cfgPath := fs.String("config", "", "config file, for the NATS settings (optional)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 0, "give up after this long (default: 10m with --wait, 10s otherwise, none for watch)")
	var (
		host, image, commandID, httpURL string
		cpus, mem                       int
		wait, all                       bool
		refresh                         time.Duration
		labels                          = labelFlags{}
	)
	switch verb {
	case "create":
		fs.StringVar(&host, "host", "", "host to run on (default: chosen by the fleet)")
		fs.StringVar(&image, "image", "", "image (default: the config's default_image)")
		fs.IntVar(&cpus, "cpus", 0, "vCPUs (default from config)")
		fs.IntVar(&mem, "memory-mib", 0, "memory in MiB (default from config)")
		fs.Var(labels, "label", "label key=value (repeatable)")
		fallthrough
	case "delete":
		fs.StringVar(&commandID, "command-id", "", "command id (Nats-Msg-Id); default: a fresh one")
		fs.BoolVar(&wait, "wait", false, "wait for the final result; exit 1 if rejected or failed")
	case "list":
		fs.BoolVar(&all, "all", false, "include deleted proxies")
	case "watch":
		fs.DurationVar(&refresh, "refresh", time.Second, "redraw at most this often")
	case "rotation":
		fs.StringVar(&httpURL, "http", "", "read from a health process's HTTP address (e.g. http://127.0.0.1:8080) instead of the KV bucket")
	}
	// Flags may come after the ID: proxyfleet create p1 --wait.
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return exitError{2}
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	needID := verb == "create" || verb == "delete" || verb == "get"
	if needID && len(pos) != 1 || !needID && len(pos) != 0 {
		fmt.Fprintf(stderr, "usage: proxyfleet %s%s [flags]\n", verb, map[bool]string{true: " ID"}[needID])
		return exitError{2}
	}
	if *cfgPath != "" {
		c, err := loadConfig(*cfgPath)
		if err != nil {
			return err
		}
		nf.merge(c)
	}
	if nf.url == "" {
		nf.url = defaultNATSURL
	}
	switch {
	case *timeout > 0:
	case verb == "watch":
	case wait:
		*timeout = 10 * time.Minute
	default:
		*timeout = 10 * time.Second
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	if verb == "rotation" && httpURL != "" {
		rot, err := client.RotationURL(ctx, http.DefaultClient, httpURL)
		if err != nil {
			return err
		}
		return output(stdout, *asJSON, rot, func() error { return client.PrintRotation(stdout, rot) })
	}
	nc, err := nf.connect("proxyfleet-cli", inboxClient, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	var opts []client.Option
	if wait && !*asJSON {
		opts = append(opts, client.WithOnResult(func(r messages.Result) {
			if r.Outcome == messages.OutcomeAccepted {
				fmt.Fprintf(stderr, "%s %s: accepted, command %s\n", r.Op, r.ID, r.CommandID)
			}
		}))
	}
	cl, err := client.New(nc, nf.prefix, opts...)
	if err != nil {
		return err
	}
	switch verb {
	case "create", "delete":
		var o client.Outcome
		if verb == "create" {
			o, err = cl.Create(ctx, messages.CreateCommand{ID: pos[0], Host: host, Image: image, CPUs: cpus, MemoryMiB: mem, Labels: labels}, commandID, wait)
		} else {
			o, err = cl.Delete(ctx, pos[0], commandID, wait)
		}
		if err != nil {
			return err
		}
		if err := output(stdout, *asJSON, o, func() error { return client.PrintOutcome(stdout, o) }); err != nil {
			return err
		}
		if o.Failed() {
			return exitError{1}
		}
		return nil
	case "get":
		st, err := cl.Get(ctx, pos[0])
		if errors.Is(err, client.ErrNotFound) {
			fmt.Fprintf(stderr, "proxy %s: not found\n", pos[0])
			return exitError{1}
		}
		if err != nil {
			return err
		}
		return output(stdout, *asJSON, st, func() error { return client.PrintStatus(stdout, st) })
	case "list":
		var lo []client.ListOption
		if all {
			lo = append(lo, client.IncludeDeleted())
		}
		sts, err := cl.List(ctx, lo...)
		if err != nil {
			return err
		}
		return output(stdout, *asJSON, sts, func() error { return client.PrintStatusTable(stdout, sts) })
	case "watch":
		var wo []client.WatchOption
		if *asJSON {
			wo = append(wo, client.WithWatchMode(client.WatchJSON))
		}
		wt, err := cl.Watch(ctx)
		if err == nil {
			err = client.PrintWatch(stdout, wt, refresh, wo...)
			wt.Stop()
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		return err
	case "rotation":
		rot, err := cl.Rotation(ctx)
		if err != nil {
			return err
		}
		return output(stdout, *asJSON, rot, func() error { return client.PrintRotation(stdout, rot) })
	}
	return nil
}

func output(w io.Writer, asJSON bool, v any, text func() error) error {
	if asJSON {
		return client.WriteJSON(w, v)
	}
	return text()
}
