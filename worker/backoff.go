package worker

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff gives the delay before attempt+1 after attempt failed
// transiently. Attempts count from 1. Tests inject their own.
type Backoff interface {
	Delay(attempt int) time.Duration
}

// ExpBackoff is exponential backoff with jitter, from cenkalti/backoff.
// The delay depends only on the attempt number, so it survives the message
// moving between workers: JetStream's delivery count is the state.
type ExpBackoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64 // default 2
	Jitter     float64 // randomization factor, default 0.3
}

// Delay implements Backoff.
func (e ExpBackoff) Delay(attempt int) time.Duration {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = e.Initial
	b.MaxInterval = e.Max
	b.MaxElapsedTime = 0
	b.Multiplier = e.Multiplier
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	b.RandomizationFactor = e.Jitter
	if e.Jitter == 0 {
		b.RandomizationFactor = 0.3
	}
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt && i < 64; i++ {
		d = b.NextBackOff()
	}
	return d
}
