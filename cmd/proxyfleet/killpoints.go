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

// poolCrashHook is the pool controller's kill points: with
// PROXYFLEET_TEST_KILL_AT=pool-after-intent (a pass stored new members in
// a pool's record and published none of their creates) or
// pool-after-publish (it published them and has not recorded so), the
// process SIGKILLs itself there, once per marker file
// PROXYFLEET_TEST_KILL_ONCE.
func poolCrashHook(log *slog.Logger) func(point, pool string, ids []string) {
	at, once := os.Getenv("PROXYFLEET_TEST_KILL_AT"), os.Getenv("PROXYFLEET_TEST_KILL_ONCE")
	if (at != "pool-after-intent" && at != "pool-after-publish") || once == "" {
		return nil
	}
	return func(point, pool string, ids []string) {
		if "pool-"+point != at {
			return
		}
		f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return // someone died here already
		}
		f.WriteString(pool + "\n")
		f.Close()
		log.Warn("test seam: SIGKILL", "at", at, "pool", pool, "members", len(ids))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}
