package worker

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// A host's run that the membership does not want pulled has no supervisor
// once it has checked it has nothing to do, and one starts again when
// asked, unless the worker is stopping.
func TestIdleRunsHaveNoSupervisor(t *testing.T) {
	w := &Worker{metrics: newMetrics(), log: slog.New(slog.DiscardHandler)}
	w.cfg.CheckInterval = time.Hour
	w.life.open(stageSupervisors)
	defer w.life.stopAll()
	c := &consumerRun{w: w, host: "h1", kick: make(chan struct{}, 1)}
	running := func() bool {
		w.superMu.Lock()
		defer w.superMu.Unlock()
		return c.superOn
	}
	for round := range 3 {
		c.kick <- struct{}{}
		w.supervise(c)
		poll.Until(t, fmt.Sprintf("round %d: the idle run's supervisor to end", round), 10*time.Second, func() bool { return !running() })
	}
	w.life.stop(stageSupervisors)
	w.supervise(c)
	if running() {
		t.Fatal("a supervisor started while the worker stops")
	}
}
