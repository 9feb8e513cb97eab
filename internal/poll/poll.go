// Package poll waits in tests for a condition to hold, bounded by a
// deadline, instead of sleeping for a guessed time. Every test package
// polls through it, so there is one loop to get right.
package poll

import (
	"testing"
	"time"
)

// Every is how often conditions are checked.
const Every = 10 * time.Millisecond

// Wait checks cond every Every until it holds or bound passes, and reports
// whether it held. cond runs on the caller's goroutine.
func Wait(bound time.Duration, cond func() bool) bool { return WaitEvery(bound, Every, cond) }

// WaitEvery is Wait checking every interval, for conditions that cost a
// round trip to a real daemon.
func WaitEvery(bound, interval time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return true
			}
		case <-deadline.C:
			return cond()
		}
	}
}

// Until is Wait that fails the test when the bound passes, naming what it
// waited for.
func Until(tb testing.TB, what string, bound time.Duration, cond func() bool) {
	tb.Helper()
	if !Wait(bound, cond) {
		tb.Fatalf("timed out after %s waiting for %s", bound, what)
	}
}
