package worker

import (
	"sync/atomic"
	"time"
)

// bootGuess learns how long a host's proxies take from the start of their
// Create until they are seen running with an address, so that the wait
// for a new one reads it first about when it should be up, not at once
// and again and again while it boots: a kvm guest takes tens of seconds,
// and each read is a call to the host. The guess is a moving average of
// the boots seen (each counts a quarter), which is an overestimate by up
// to the last pause, so the first read comes at three quarters of it,
// and never later than the longest pause (a first boot that waited for
// an image transfer guesses long); a boot longer than the guess is then
// read at the pauses that follow, doubling, as without a guess.
type bootGuess struct {
	avg atomic.Int64 // ns; 0: no boot seen yet
}

// observe adds the time of one boot to the guess.
func (b *bootGuess) observe(d time.Duration) {
	if d <= 0 {
		return
	}
	for {
		old := b.avg.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/4
		}
		if b.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

// firstRead is when the wait for a proxy whose Create began at created
// reads it first: three quarters of the guess after created, but not
// before floor from now nor later than ceil from now (the longest
// pause). Without a guess, floor from now.
func (b *bootGuess) firstRead(created, now time.Time, floor, ceil time.Duration) time.Duration {
	guess := time.Duration(b.avg.Load())
	if guess <= 0 || created.IsZero() {
		return floor
	}
	return min(max(created.Add(guess*3/4).Sub(now), floor), max(ceil, floor))
}
