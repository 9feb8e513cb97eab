//go:build !killpoints

package main

import (
	"log/slog"

	"proxyfleet/kvm"
)

// crashHooks: a release build has no kill points (killpoints.go, built
// with -tags killpoints for the end-to-end tests, has them).
func crashHooks(*slog.Logger) kvm.Hooks { return kvm.Hooks{} }

// poolCrashHook: none in a release build.
func poolCrashHook(*slog.Logger) func(string, string, []string) { return nil }
