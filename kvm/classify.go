package kvm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	"proxyfleet/fleet"
)

// Classification happens here and nowhere else in the package: every error
// the link returns has been through Classify, and everything above matches
// with fleet.ClassOf / errors.Is.
//
// The rules, in order:
//
//  1. An error that already carries an explicit class (fleet.Transient,
//     Permanent, NotFound anywhere in its tree) keeps the outermost one. So
//     an explicit transient wrap wins over any libvirt code inside a joined
//     error (an address read that failed on every source must not be
//     latched permanent by the first code found in the join).
//  2. Otherwise the error tree is walked breadth first, closest to the
//     caller first, and the first node that a table below knows decides.
//  3. What no table knows is permanent: only errors known to be transient
//     are retried.

// codeClass maps libvirt error codes to classes. Codes not listed are
// permanent.
var codeClass = map[libvirt.ErrorNumber]fleet.Class{
	// The object is not there.
	libvirt.ErrNoDomain:           fleet.ClassNotFound,
	libvirt.ErrNoNetwork:          fleet.ClassNotFound,
	libvirt.ErrNoStoragePool:      fleet.ClassNotFound,
	libvirt.ErrNoStorageVol:       fleet.ClassNotFound,
	libvirt.ErrNoDomainMetadata:   fleet.ClassNotFound, // the domain has no mark in our namespace
	libvirt.ErrNoSecret:           fleet.ClassNotFound,
	libvirt.ErrNoInterface:        fleet.ClassNotFound,
	libvirt.ErrNoNodeDevice:       fleet.ClassNotFound,
	libvirt.ErrNoNwfilter:         fleet.ClassNotFound,
	libvirt.ErrNoNwfilterBinding:  fleet.ClassNotFound,
	libvirt.ErrNoDomainSnapshot:   fleet.ClassNotFound,
	libvirt.ErrNoDomainCheckpoint: fleet.ClassNotFound,
	libvirt.ErrNoDomainBackup:     fleet.ClassNotFound,
	libvirt.ErrNoNetworkPort:      fleet.ClassNotFound,
	libvirt.ErrNoNetworkMetadata:  fleet.ClassNotFound,
	libvirt.ErrNoHostname:         fleet.ClassNotFound,

	// What a retry may fix.
	libvirt.ErrAgentCommandFailed:  fleet.ClassTransient, // the guest agent answered with an error: it may be starting
	libvirt.ErrAgentCommandTimeout: fleet.ClassTransient,
	libvirt.ErrAgentUnresponsive:   fleet.ClassTransient,
	libvirt.ErrAgentUnsynced:       fleet.ClassTransient,
	libvirt.ErrOperationTimeout:    fleet.ClassTransient, // e.g. waiting for a domain's job lock
	libvirt.ErrOperationAborted:    fleet.ClassTransient,
	libvirt.ErrResourceBusy:        fleet.ClassTransient,
	libvirt.ErrBlockCopyActive:     fleet.ClassTransient,
	libvirt.ErrRPC:                 fleet.ClassTransient, // libvirtd's own RPC layer
	libvirt.ErrNoConnect:           fleet.ClassTransient, // libvirtd lost its hypervisor connection
	libvirt.ErrInvalidConn:         fleet.ClassTransient,
	libvirt.ErrSSH:                 fleet.ClassTransient,
	libvirt.ErrLibssh:              fleet.ClassTransient,
	libvirt.ErrNoMemory:            fleet.ClassTransient, // the host is short of memory now
	// A system call failed inside libvirtd (EIO, EAGAIN, ENOSPC, a file
	// busy…). Mostly conditions of the host that pass; a lasting one
	// costs a bounded number of attempts and ends in failed, which is
	// cheaper than failing a proxy for a passing one.
	libvirt.ErrSystemError: fleet.ClassTransient,
	// "Requested operation is not valid": the object is in the wrong
	// state for the call (start of a running domain, destroy of a stopped
	// one, a pool not active). The executor is level-triggered and reads
	// the state again on the next attempt, so a retry converges instead of
	// failing the proxy on a race with the domain's own state changes.
	// Callers that know a state error means success (destroy of a stopped
	// domain) check the code themselves before this table.
	libvirt.ErrOperationInvalid: fleet.ClassTransient,
	// A name collision: another create of the same object raced ours (a
	// worker taking over a host). The next attempt finds the object by its
	// mark; a foreign object of the same name fails after the bounded
	// attempts with this message.
	libvirt.ErrDomExist:        fleet.ClassTransient,
	libvirt.ErrStorageVolExist: fleet.ClassTransient,
	libvirt.ErrNetworkExist:    fleet.ClassTransient,

	// Refused for good: a retry would get the same answer.
	libvirt.ErrInternalError:        fleet.ClassPermanent,
	libvirt.ErrNoSupport:            fleet.ClassPermanent,
	libvirt.ErrInvalidArg:           fleet.ClassPermanent,
	libvirt.ErrOperationFailed:      fleet.ClassPermanent,
	libvirt.ErrXMLError:             fleet.ClassPermanent,
	libvirt.ErrXMLDetail:            fleet.ClassPermanent,
	libvirt.ErrXMLInvalidSchema:     fleet.ClassPermanent,
	libvirt.ErrOperationDenied:      fleet.ClassPermanent,
	libvirt.ErrAccessDenied:         fleet.ClassPermanent,
	libvirt.ErrAuthFailed:           fleet.ClassPermanent,
	libvirt.ErrAuthCancelled:        fleet.ClassPermanent,
	libvirt.ErrAuthUnavailable:      fleet.ClassPermanent,
	libvirt.ErrConfigUnsupported:    fleet.ClassPermanent,
	libvirt.ErrArgumentUnsupported:  fleet.ClassPermanent,
	libvirt.ErrOperationUnsupported: fleet.ClassPermanent,
	libvirt.ErrCPUIncompatible:      fleet.ClassPermanent,
	libvirt.ErrInvalidDomain:        fleet.ClassPermanent,
	libvirt.ErrInvalidNetwork:       fleet.ClassPermanent,
	libvirt.ErrInvalidStoragePool:   fleet.ClassPermanent,
	libvirt.ErrInvalidStorageVol:    fleet.ClassPermanent,
	libvirt.ErrInvalidMac:           fleet.ClassPermanent,
	libvirt.ErrDeviceMissing:        fleet.ClassPermanent,
	libvirt.ErrHookScriptFailed:     fleet.ClassPermanent,
	libvirt.ErrStorageProbeFailed:   fleet.ClassPermanent,
}

// sentinelClass maps sentinel errors, matched by identity at a node of the
// error tree.
var sentinelClass = map[error]fleet.Class{
	// The link or its transport ended: redial and try again.
	ErrLinkDead:              fleet.ClassTransient,
	ErrKeepalive:             fleet.ClassTransient,
	libvirt.ErrInterrupted:   fleet.ClassTransient, // the socket closed under a call
	io.EOF:                   fleet.ClassTransient,
	io.ErrUnexpectedEOF:      fleet.ClassTransient,
	io.ErrClosedPipe:         fleet.ClassTransient,
	net.ErrClosed:            fleet.ClassTransient,
	os.ErrDeadlineExceeded:   fleet.ClassTransient,
	context.Canceled:         fleet.ClassTransient,
	context.DeadlineExceeded: fleet.ClassTransient,
	errSSHClosed:             fleet.ClassTransient,
	// Refused for good.
	ErrHostKey:             fleet.ClassPermanent,
	ErrAuthRefused:         fleet.ClassPermanent,
	libvirt.ErrUnsupported: fleet.ClassPermanent, // "unknown procedure": the daemon is too old
}

// errnoClass maps raw system call errors.
var errnoClass = map[syscall.Errno]fleet.Class{
	syscall.ECONNRESET:   fleet.ClassTransient,
	syscall.ECONNREFUSED: fleet.ClassTransient,
	syscall.ECONNABORTED: fleet.ClassTransient,
	syscall.EPIPE:        fleet.ClassTransient,
	syscall.ETIMEDOUT:    fleet.ClassTransient,
	syscall.EHOSTUNREACH: fleet.ClassTransient,
	syscall.ENETUNREACH:  fleet.ClassTransient,
	syscall.EHOSTDOWN:    fleet.ClassTransient,
	// go-libvirt's SendPacket returns a bare EINVAL when its socket is
	// already disconnected (socket.go: "mirrors what a lot of net code
	// return on use of a no longer valid connection").
	syscall.EINVAL: fleet.ClassTransient,
}

// classOfNode classifies one node of an error tree, ignoring what it wraps.
func classOfNode(e error) fleet.Class {
	switch v := e.(type) {
	case libvirt.Error:
		return codeClassOf(v.Code)
	case *libvirt.Error:
		return codeClassOf(v.Code)
	case syscall.Errno:
		return errnoClass[v]
	case *net.OpError:
		// Dial, read and write failures of a socket. Their cause may be
		// more specific (an errno below), but every one of them is a
		// network condition.
		return fleet.ClassTransient
	case *ssh.OpenChannelError:
		// The host's sshd could not reach the libvirt socket (libvirtd
		// down or restarting), or refuses to forward at all.
		if v.Reason == ssh.ConnectionFailed {
			return fleet.ClassTransient
		}
		return fleet.ClassPermanent
	}
	if c, ok := sentinelClass[e]; ok {
		return c
	}
	return fleet.ClassNone
}

func codeClassOf(code uint32) fleet.Class {
	if c, ok := codeClass[libvirt.ErrorNumber(code)]; ok {
		return c
	}
	return fleet.ClassPermanent
}

// classOf is the class Classify gives err.
func classOf(err error) fleet.Class {
	if err == nil {
		return fleet.ClassNone
	}
	if errors.Is(err, fleet.ErrTransient) || errors.Is(err, fleet.ErrPermanent) || errors.Is(err, fleet.ErrNotFound) {
		return fleet.ClassOf(err) // an explicit class: the outermost wins
	}
	c := fleet.ClassPermanent // what no table knows
	fleet.Walk(err, func(e error) bool {
		if n := classOfNode(e); n != fleet.ClassNone {
			c = n
			return true
		}
		return false
	})
	return c
}

// Classify returns err marked with its fleet class (see the rules above). An
// error that already carries a class is returned as it is. nil stays nil.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, fleet.ErrTransient) || errors.Is(err, fleet.ErrPermanent) || errors.Is(err, fleet.ErrNotFound) {
		return err
	}
	switch classOf(err) {
	case fleet.ClassTransient:
		return fleet.Transient(err)
	case fleet.ClassNotFound:
		return fleet.NotFound(err)
	default:
		return fleet.Permanent(err)
	}
}

// isTransport reports whether err says the link itself failed (as opposed
// to libvirtd answering with an error), so the link must be redialed.
func isTransport(err error) bool {
	if err == nil {
		return false
	}
	var le libvirt.Error
	if errors.As(err, &le) {
		return false
	}
	var op *net.OpError
	var errno syscall.Errno
	switch {
	case errors.Is(err, ErrLinkDead), errors.Is(err, libvirt.ErrInterrupted),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, io.ErrClosedPipe), errors.Is(err, net.ErrClosed),
		errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &op):
		return true
	case errors.As(err, &errno):
		return errnoClass[errno] == fleet.ClassTransient
	}
	return false
}
