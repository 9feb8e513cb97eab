package main

import (
	"context"
	"flag"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// hostQuarantineCmd is `proxyfleet host quarantine HOST [--reason R]`: an
// operator's quarantine, which only a release ends.
type hostQuarantineCmd struct {
	sendFlags
	reason, by string
}

func (h *hostQuarantineCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&h.reason, "reason", "", "why, kept in the host's record as \"operator: REASON\" (at most 256 bytes)")
	fs.StringVar(&h.by, "by", "", "who asks, kept in the reason as \"operator BY: REASON\" (optional)")
	h.sendFlags.flags(fs)
}

func (h *hostQuarantineCmd) run(ctx context.Context, in *invocation) error {
	cmd := messages.HostCommand{Host: in.id, Reason: h.reason, By: h.by}
	return h.send(ctx, in, func(cl *client.Client) (client.Outcome, error) {
		return cl.QuarantineHost(ctx, cmd, h.commandID, h.wait)
	})
}

// hostReleaseCmd is `proxyfleet host release HOST`: any quarantine of the
// host ends, an operator's or an automatic one.
type hostReleaseCmd struct{ sendFlags }

func (h *hostReleaseCmd) run(ctx context.Context, in *invocation) error {
	return h.send(ctx, in, func(cl *client.Client) (client.Outcome, error) {
		return cl.ReleaseHost(ctx, messages.HostCommand{Host: in.id}, h.commandID, h.wait)
	})
}
