package client

import (
	"context"
	"encoding/json"
	"fmt"

	"proxyfleet/messages"
)

// QuarantineHost publishes an operator's quarantine of cmd.Host: placement
// skips the host and its work waits until a release. With wait it returns
// once a worker recorded it (done).
func (c *Client) QuarantineHost(ctx context.Context, cmd messages.HostCommand, commandID string, wait bool) (Outcome, error) {
	return c.sendHost(ctx, messages.OpHostQuarantine, cmd, commandID, wait)
}

// ReleaseHost publishes a release of cmd.Host: any quarantine of it ends
// (an operator's, or an automatic one before its cool-down is over).
func (c *Client) ReleaseHost(ctx context.Context, cmd messages.HostCommand, commandID string, wait bool) (Outcome, error) {
	return c.sendHost(ctx, messages.OpHostRelease, cmd, commandID, wait)
}

func (c *Client) sendHost(ctx context.Context, op string, cmd messages.HostCommand, commandID string, wait bool) (Outcome, error) {
	if cmd.V == 0 {
		cmd.V = messages.Version
	}
	if err := checkToken(cmd.Host); err != nil {
		fe, _ := messages.AsFieldError(err)
		return Outcome{}, &messages.FieldError{Field: "host", Reason: fe.Reason}
	}
	if err := cmd.Validate(cmd.Host); err != nil {
		return Outcome{}, err
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode %s: %w", op, err)
	}
	return c.sendTo(ctx, target{op: op, id: cmd.Host, subject: c.subj.HostCommand(op, cmd.Host), result: c.subj.HostResult(cmd.Host),
		stream: messages.StreamHostCommands}, body, commandID, wait)
}
