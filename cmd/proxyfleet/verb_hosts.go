package main

import (
	"context"
	"flag"
	"time"

	"proxyfleet/client"
)

// hostsCmd is `proxyfleet hosts`: each host's owner, room and state.
type hostsCmd struct{}

func (*hostsCmd) flags(*flag.FlagSet)    {}
func (*hostsCmd) timeout() time.Duration { return defaultTimeout }

func (*hostsCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	hosts, err := cl.Hosts(ctx)
	if err != nil {
		return err
	}
	return in.output(hosts, func() error { return client.PrintHosts(in.stdout, hosts) })
}
