package messages

import (
	"strings"
	"unicode"
)

// Host commands: an operator quarantines a host (placement skips it, its
// work waits) or releases it, by a command on
// <prefix>.cmd.host.{quarantine,release}.<host>, in the work queue
// PROXY_HOSTCMDS, answered on <prefix>.result.host.<host>. A worker
// applies it to the host's record in PROXY_HOSTS with compare-and-set;
// see docs/ARCHITECTURE.md, "Quarantine".

// StreamHostCommands is a work queue over <prefix>.cmd.host.>: host
// commands, consumed by the workers running intake through one shared
// durable consumer.
const StreamHostCommands = "PROXY_HOSTCMDS"

// Host operations: the op of a host command's results.
const (
	OpHostQuarantine = "host.quarantine"
	OpHostRelease    = "host.release"
)

// The subject tokens of host commands: <prefix>.cmd.host.<token>.<host>.
const (
	hostQuarantineToken = "quarantine"
	hostReleaseToken    = "release"
)

// Bounds of a host command's free text.
const (
	MaxHostReason = 256
	MaxHostBy     = 64
)

// OperatorReason starts the Reason of a host record an operator's command
// quarantined: "operator: <reason>", or "operator <by>: <reason>".
const OperatorReason = "operator"

// HostCommand is published on <prefix>.cmd.host.quarantine.<host> and
// <prefix>.cmd.host.release.<host>. Reason says why (kept in the host's
// record with a quarantine), By who asked (a console user; optional).
type HostCommand struct {
	V      int    `json:"v"`
	Host   string `json:"host"`
	Reason string `json:"reason,omitempty"`
	By     string `json:"by,omitempty"`
}

// RecordReason is the Reason an operator's quarantine by c keeps in the
// host's record.
func (c HostCommand) RecordReason() string {
	who := OperatorReason
	if c.By != "" {
		who += " " + c.By
	}
	if c.Reason == "" {
		return who + ": quarantined by command"
	}
	return who + ": " + c.Reason
}

// DecodeHostCommand decodes and validates a host command published with
// subjectHost as the subject's host token. Whether the host exists is the
// worker's to check (it needs the config).
func DecodeHostCommand(body []byte, subjectHost string) (HostCommand, error) {
	var c HostCommand
	if err := decodeStrict(body, &c); err != nil {
		return HostCommand{}, err
	}
	return c, c.Validate(subjectHost)
}

// Validate checks c against the subject's host token.
func (c HostCommand) Validate(subjectHost string) error {
	switch {
	case c.V != Version:
		return fieldErr("v", "version %d is not supported, want %d", c.V, Version)
	case c.Host == "":
		return fieldErr("host", "missing")
	case !ValidID(c.Host):
		return fieldErr("host", "%q is not a valid host name", truncate(c.Host))
	case c.Host != subjectHost:
		return fieldErr("host", "body host %q does not match the subject's %q", c.Host, truncate(subjectHost))
	case len(c.Reason) > MaxHostReason:
		return fieldErr("reason", "%d bytes, at most %d", len(c.Reason), MaxHostReason)
	case !printable(c.Reason):
		return fieldErr("reason", "control characters are not allowed")
	case len(c.By) > MaxHostBy:
		return fieldErr("by", "%d bytes, at most %d", len(c.By), MaxHostBy)
	case !printable(c.By) || strings.Contains(c.By, ":"):
		return fieldErr("by", "control characters and ':' are not allowed")
	}
	return nil
}

func printable(s string) bool {
	return !strings.ContainsFunc(s, unicode.IsControl)
}

// Manual reports whether r is quarantined by an operator's command: a
// quarantine without a cool-down (Until zero), which no probe ends, only a
// release.
func (r HostRecord) Manual() bool { return r.Quarantined() && r.Until.IsZero() }

// HostCommand is the subject of host op (OpHostQuarantine,
// OpHostRelease) for host.
func (s Subjects) HostCommand(op, host string) string {
	tok := hostQuarantineToken
	if op == OpHostRelease {
		tok = hostReleaseToken
	}
	return s.join("cmd", "host", tok, host)
}

// HostCommandAll matches every host command (the stream's subject).
func (s Subjects) HostCommandAll() string { return s.join("cmd", "host", ">") }

// HostResult is <prefix>.result.host.<host>, where a host command is
// answered (PROXY_RESULTS keeps it, as every result.>).
func (s Subjects) HostResult(host string) string { return s.join("result", "host", host) }

// ParseHostCommand splits <prefix>.cmd.host.<op>.<host> into the op
// (OpHostQuarantine, OpHostRelease) and the host token, unvalidated.
func (s Subjects) ParseHostCommand(subject string) (op, host string, err error) {
	return s.parseCommand(subject, "host", "<host>", [][2]string{{hostQuarantineToken, OpHostQuarantine}, {hostReleaseToken, OpHostRelease}})
}
