package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	"proxyfleet/fleet"
)

type classRow struct {
	name string
	err  error
	want fleet.Class
}

// classRows has one row per entry of the classification tables, plus the
// rules around them. TestClassify_tableCoversEveryEntry keeps the two in
// step.
func classRows() []classRow {
	lvErr := func(code libvirt.ErrorNumber) error {
		return libvirt.Error{Code: uint32(code), Message: "m"}
	}
	return []classRow{
		// libvirt codes, one row per entry of codeClass.
		{"code ErrNoDomain", libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNetwork", libvirt.Error{Code: uint32(libvirt.ErrNoNetwork), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoStoragePool", libvirt.Error{Code: uint32(libvirt.ErrNoStoragePool), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoStorageVol", libvirt.Error{Code: uint32(libvirt.ErrNoStorageVol), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoDomainMetadata", libvirt.Error{Code: uint32(libvirt.ErrNoDomainMetadata), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoSecret", libvirt.Error{Code: uint32(libvirt.ErrNoSecret), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoInterface", libvirt.Error{Code: uint32(libvirt.ErrNoInterface), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNodeDevice", libvirt.Error{Code: uint32(libvirt.ErrNoNodeDevice), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNwfilter", libvirt.Error{Code: uint32(libvirt.ErrNoNwfilter), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNwfilterBinding", libvirt.Error{Code: uint32(libvirt.ErrNoNwfilterBinding), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoDomainSnapshot", libvirt.Error{Code: uint32(libvirt.ErrNoDomainSnapshot), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoDomainCheckpoint", libvirt.Error{Code: uint32(libvirt.ErrNoDomainCheckpoint), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoDomainBackup", libvirt.Error{Code: uint32(libvirt.ErrNoDomainBackup), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNetworkPort", libvirt.Error{Code: uint32(libvirt.ErrNoNetworkPort), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoNetworkMetadata", libvirt.Error{Code: uint32(libvirt.ErrNoNetworkMetadata), Message: "m"}, fleet.ClassNotFound},
		{"code ErrNoHostname", libvirt.Error{Code: uint32(libvirt.ErrNoHostname), Message: "m"}, fleet.ClassNotFound},
		{"code ErrAgentCommandFailed", libvirt.Error{Code: uint32(libvirt.ErrAgentCommandFailed), Message: "m"}, fleet.ClassTransient},
		{"code ErrAgentCommandTimeout", libvirt.Error{Code: uint32(libvirt.ErrAgentCommandTimeout), Message: "m"}, fleet.ClassTransient},
		{"code ErrAgentUnresponsive", libvirt.Error{Code: uint32(libvirt.ErrAgentUnresponsive), Message: "m"}, fleet.ClassTransient},
		{"code ErrAgentUnsynced", libvirt.Error{Code: uint32(libvirt.ErrAgentUnsynced), Message: "m"}, fleet.ClassTransient},
		{"code ErrOperationTimeout", libvirt.Error{Code: uint32(libvirt.ErrOperationTimeout), Message: "m"}, fleet.ClassTransient},
		{"code ErrOperationAborted", libvirt.Error{Code: uint32(libvirt.ErrOperationAborted), Message: "m"}, fleet.ClassTransient},
		{"code ErrResourceBusy", libvirt.Error{Code: uint32(libvirt.ErrResourceBusy), Message: "m"}, fleet.ClassTransient},
		{"code ErrBlockCopyActive", libvirt.Error{Code: uint32(libvirt.ErrBlockCopyActive), Message: "m"}, fleet.ClassTransient},
		{"code ErrRPC", libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "m"}, fleet.ClassTransient},
		{"code ErrNoConnect", libvirt.Error{Code: uint32(libvirt.ErrNoConnect), Message: "m"}, fleet.ClassTransient},
		{"code ErrInvalidConn", libvirt.Error{Code: uint32(libvirt.ErrInvalidConn), Message: "m"}, fleet.ClassTransient},
		{"code ErrSSH", libvirt.Error{Code: uint32(libvirt.ErrSSH), Message: "m"}, fleet.ClassTransient},
		{"code ErrLibssh", libvirt.Error{Code: uint32(libvirt.ErrLibssh), Message: "m"}, fleet.ClassTransient},
		{"code ErrNoMemory", libvirt.Error{Code: uint32(libvirt.ErrNoMemory), Message: "m"}, fleet.ClassTransient},
		{"code ErrSystemError", libvirt.Error{Code: uint32(libvirt.ErrSystemError), Message: "m"}, fleet.ClassTransient},
		{"code ErrOperationInvalid", libvirt.Error{Code: uint32(libvirt.ErrOperationInvalid), Message: "m"}, fleet.ClassTransient},
		{"code ErrDomExist", libvirt.Error{Code: uint32(libvirt.ErrDomExist), Message: "m"}, fleet.ClassTransient},
		{"code ErrStorageVolExist", libvirt.Error{Code: uint32(libvirt.ErrStorageVolExist), Message: "m"}, fleet.ClassTransient},
		{"code ErrNetworkExist", libvirt.Error{Code: uint32(libvirt.ErrNetworkExist), Message: "m"}, fleet.ClassTransient},
		{"code ErrInternalError", libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: "m"}, fleet.ClassPermanent},
		{"code ErrNoSupport", libvirt.Error{Code: uint32(libvirt.ErrNoSupport), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidArg", libvirt.Error{Code: uint32(libvirt.ErrInvalidArg), Message: "m"}, fleet.ClassPermanent},
		{"code ErrOperationFailed", libvirt.Error{Code: uint32(libvirt.ErrOperationFailed), Message: "m"}, fleet.ClassPermanent},
		{"code ErrXMLError", libvirt.Error{Code: uint32(libvirt.ErrXMLError), Message: "m"}, fleet.ClassPermanent},
		{"code ErrXMLDetail", libvirt.Error{Code: uint32(libvirt.ErrXMLDetail), Message: "m"}, fleet.ClassPermanent},
		{"code ErrXMLInvalidSchema", libvirt.Error{Code: uint32(libvirt.ErrXMLInvalidSchema), Message: "m"}, fleet.ClassPermanent},
		{"code ErrOperationDenied", libvirt.Error{Code: uint32(libvirt.ErrOperationDenied), Message: "m"}, fleet.ClassPermanent},
		{"code ErrAccessDenied", libvirt.Error{Code: uint32(libvirt.ErrAccessDenied), Message: "m"}, fleet.ClassPermanent},
		{"code ErrAuthFailed", libvirt.Error{Code: uint32(libvirt.ErrAuthFailed), Message: "m"}, fleet.ClassPermanent},
		{"code ErrAuthCancelled", libvirt.Error{Code: uint32(libvirt.ErrAuthCancelled), Message: "m"}, fleet.ClassPermanent},
		{"code ErrAuthUnavailable", libvirt.Error{Code: uint32(libvirt.ErrAuthUnavailable), Message: "m"}, fleet.ClassPermanent},
		{"code ErrConfigUnsupported", libvirt.Error{Code: uint32(libvirt.ErrConfigUnsupported), Message: "m"}, fleet.ClassPermanent},
		{"code ErrArgumentUnsupported", libvirt.Error{Code: uint32(libvirt.ErrArgumentUnsupported), Message: "m"}, fleet.ClassPermanent},
		{"code ErrOperationUnsupported", libvirt.Error{Code: uint32(libvirt.ErrOperationUnsupported), Message: "m"}, fleet.ClassPermanent},
		{"code ErrCPUIncompatible", libvirt.Error{Code: uint32(libvirt.ErrCPUIncompatible), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidDomain", libvirt.Error{Code: uint32(libvirt.ErrInvalidDomain), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidNetwork", libvirt.Error{Code: uint32(libvirt.ErrInvalidNetwork), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidStoragePool", libvirt.Error{Code: uint32(libvirt.ErrInvalidStoragePool), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidStorageVol", libvirt.Error{Code: uint32(libvirt.ErrInvalidStorageVol), Message: "m"}, fleet.ClassPermanent},
		{"code ErrInvalidMac", libvirt.Error{Code: uint32(libvirt.ErrInvalidMac), Message: "m"}, fleet.ClassPermanent},
		{"code ErrDeviceMissing", libvirt.Error{Code: uint32(libvirt.ErrDeviceMissing), Message: "m"}, fleet.ClassPermanent},
		{"code ErrHookScriptFailed", libvirt.Error{Code: uint32(libvirt.ErrHookScriptFailed), Message: "m"}, fleet.ClassPermanent},
		{"code ErrStorageProbeFailed", libvirt.Error{Code: uint32(libvirt.ErrStorageProbeFailed), Message: "m"}, fleet.ClassPermanent},
		{"code not in the table (ErrMigrateUnsafe)", lvErr(libvirt.ErrMigrateUnsafe), fleet.ClassPermanent},
		{"code as a pointer", &libvirt.Error{Code: uint32(libvirt.ErrNoDomain)}, fleet.ClassNotFound},
		{"code wrapped with context", fmt.Errorf("define domain p1: %w", lvErr(libvirt.ErrXMLError)), fleet.ClassPermanent},

		// Sentinels, one row per entry of sentinelClass.
		{"ErrLinkDead", &deadError{host: "h1", reason: errors.New("x")}, fleet.ClassTransient},
		{"ErrKeepalive", fmt.Errorf("%w: no reply", ErrKeepalive), fleet.ClassTransient},
		{"libvirt.ErrInterrupted", libvirt.ErrInterrupted, fleet.ClassTransient},
		{"io.EOF", io.EOF, fleet.ClassTransient},
		{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF, fleet.ClassTransient},
		{"io.ErrClosedPipe", io.ErrClosedPipe, fleet.ClassTransient},
		{"net.ErrClosed", net.ErrClosed, fleet.ClassTransient},
		{"os.ErrDeadlineExceeded", os.ErrDeadlineExceeded, fleet.ClassTransient},
		{"context.Canceled", context.Canceled, fleet.ClassTransient},
		{"context.DeadlineExceeded", context.DeadlineExceeded, fleet.ClassTransient},
		{"errSSHClosed", errSSHClosed, fleet.ClassTransient},
		{"ErrHostKey", fmt.Errorf("%w: host h1 (198.18.100.1:22)", ErrHostKey), fleet.ClassPermanent},
		{"ErrAuthRefused", fmt.Errorf("%w: host h1 (198.18.100.1:22) refused login as root", ErrAuthRefused), fleet.ClassPermanent},
		{"libvirt.ErrUnsupported", libvirt.ErrUnsupported, fleet.ClassPermanent},

		// errnos, one row per entry of errnoClass.
		{"ECONNRESET", syscall.ECONNRESET, fleet.ClassTransient},
		{"ECONNREFUSED", syscall.ECONNREFUSED, fleet.ClassTransient},
		{"ECONNABORTED", syscall.ECONNABORTED, fleet.ClassTransient},
		{"EPIPE", syscall.EPIPE, fleet.ClassTransient},
		{"ETIMEDOUT", syscall.ETIMEDOUT, fleet.ClassTransient},
		{"EHOSTUNREACH", syscall.EHOSTUNREACH, fleet.ClassTransient},
		{"ENETUNREACH", syscall.ENETUNREACH, fleet.ClassTransient},
		{"EHOSTDOWN", syscall.EHOSTDOWN, fleet.ClassTransient},
		{"EINVAL (go-libvirt: socket disconnected)", syscall.EINVAL, fleet.ClassTransient},
		{"errno not in the table (ENOENT)", syscall.ENOENT, fleet.ClassPermanent},

		// Types.
		{"*net.OpError", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, fleet.ClassTransient},
		{"*net.OpError around an unknown cause", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("odd")}, fleet.ClassTransient},
		{"ssh open channel: connect failed", &ssh.OpenChannelError{Reason: ssh.ConnectionFailed}, fleet.ClassTransient},
		{"ssh open channel: prohibited", &ssh.OpenChannelError{Reason: ssh.Prohibited}, fleet.ClassPermanent},

		// Rules.
		{"nil", nil, fleet.ClassNone},
		{"unknown error", errors.New("something odd"), fleet.ClassPermanent},
		{"explicit transient wins over a permanent code inside a join",
			fleet.Transient(errors.Join(lvErr(libvirt.ErrInvalidArg), lvErr(libvirt.ErrAccessDenied))), fleet.ClassTransient},
		{"explicit transient wrap in a join with a permanent code",
			errors.Join(fleet.Transient(errors.New("every address source failed")), lvErr(libvirt.ErrNoSupport)), fleet.ClassTransient},
		{"explicit permanent wins over a transient code",
			fleet.Permanent(fmt.Errorf("x: %w", lvErr(libvirt.ErrOperationTimeout))), fleet.ClassPermanent},
		{"explicit not-found wrapped with context",
			fmt.Errorf("get p1: %w", fleet.NotFound(errors.New("no mark"))), fleet.ClassNotFound},
		{"closest to the caller wins: code before transport error",
			errors.Join(lvErr(libvirt.ErrInvalidArg), io.EOF), fleet.ClassPermanent},
		{"closest to the caller wins: shallower node first",
			errors.Join(fmt.Errorf("a: %w", lvErr(libvirt.ErrInvalidArg)), io.EOF), fleet.ClassTransient},
		{"dead link around a permanent-looking reason",
			&deadError{host: "h1", reason: lvErr(libvirt.ErrInvalidArg)}, fleet.ClassTransient},
	}
}

func TestClassify(t *testing.T) {
	for _, r := range classRows() {
		t.Run(r.name, func(t *testing.T) {
			got := Classify(r.err)
			if r.err == nil {
				if got != nil {
					t.Fatalf("Classify(nil) = %v", got)
				}
				return
			}
			if c := fleet.ClassOf(got); c != r.want {
				t.Fatalf("ClassOf(Classify(%v)) = %q, want %q", r.err, c, r.want)
			}
			if got.Error() != r.err.Error() {
				t.Fatalf("Classify changed the message: %q, want %q", got, r.err)
			}
			if !errors.Is(got, r.err) {
				t.Fatalf("Classify(%v) does not wrap the error", r.err)
			}
			if again := Classify(got); fleet.ClassOf(again) != r.want || again != got {
				t.Fatalf("Classify is not idempotent: %v", again)
			}
		})
	}
}

// Every entry of the three tables has a row above.
func TestClassify_tableCoversEveryEntry(t *testing.T) {
	var codes []libvirt.ErrorNumber
	var sentinels []error
	var errnos []syscall.Errno
	for _, r := range classRows() {
		var le libvirt.Error
		var errno syscall.Errno
		switch {
		case errors.As(r.err, &le):
			codes = append(codes, libvirt.ErrorNumber(le.Code))
		case errors.As(r.err, &errno):
			errnos = append(errnos, errno)
		}
		for s := range sentinelClass {
			if r.err != nil && errors.Is(r.err, s) {
				sentinels = append(sentinels, s)
			}
		}
	}
	for code := range codeClass {
		if !containsCode(codes, code) {
			t.Errorf("libvirt code %d (%v) has no row", code, code)
		}
	}
	for s := range sentinelClass {
		if !containsErr(sentinels, s) {
			t.Errorf("sentinel %q has no row", s)
		}
	}
	for e := range errnoClass {
		if !containsErrno(errnos, e) {
			t.Errorf("errno %v has no row", e)
		}
	}
}

func containsCode(s []libvirt.ErrorNumber, v libvirt.ErrorNumber) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsErr(s []error, v error) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsErrno(s []syscall.Errno, v syscall.Errno) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestIsTransport(t *testing.T) {
	for _, r := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"ErrInterrupted", libvirt.ErrInterrupted, true},
		{"EINVAL from a disconnected socket", syscall.EINVAL, true},
		{"EOF", io.EOF, true},
		{"op error", &net.OpError{Op: "write", Err: syscall.EPIPE}, true},
		{"dead link", &deadError{host: "h", reason: io.EOF}, true},
		{"libvirt code", libvirt.Error{Code: uint32(libvirt.ErrRPC)}, false},
		{"libvirt code joined with EOF", errors.Join(libvirt.Error{Code: uint32(libvirt.ErrNoDomain)}, io.EOF), false},
		{"context canceled", context.Canceled, false},
		{"unknown", errors.New("x"), false},
	} {
		if got := isTransport(r.err); got != r.want {
			t.Errorf("isTransport(%s) = %v, want %v", r.name, got, r.want)
		}
	}
}
