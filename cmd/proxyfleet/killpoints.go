//go:build killpoints

package main

import (
	"log/slog"
	"os"
	"syscall"

	"proxyfleet/kvm"
)

// crashHooks is a test seam, built only with -tags killpoints (the
// end-to-end tests build the binary so; a release build has none of it):
// with PROXYFLEET_TEST_KILL_AT set to "after-overlay" (volumes made,
// domain not defined) or "after-define" (defined, not started), the
// process SIGKILLs itself at that point of a create, once per marker file
// PROXYFLEET_TEST_KILL_ONCE (the first process to create the file dies;
// later ones carry on). Unset, it does nothing.
func crashHooks(log *slog.Logger) kvm.Hooks {
	at, once := os.Getenv("PROXYFLEET_TEST_KILL_AT"), os.Getenv("PROXYFLEET_TEST_KILL_ONCE")
	if at == "" || once == "" {
		return kvm.Hooks{}
	}
	kill := func(id string) error {
		f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return nil // someone died here already
		}
		f.WriteString(id + "\n")
		f.Close()
		log.Warn("test seam: SIGKILL", "at", at, "id", id)
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	switch at {
	case "after-overlay":
		return kvm.Hooks{AfterOverlay: kill}
	case "after-define":
		return kvm.Hooks{AfterDefine: kill}
	}
	return kvm.Hooks{}
}
