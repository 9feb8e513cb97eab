package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
)

// An event of an older command is never stored after one of a newer
// command. In the cluster test, a proxy's delete still running on its old
// host published "deleted" after its newer create had reported "running"
// from another host (another worker's), so the proxy ran but looked
// deleted, for good.
func TestEventOfAnOlderCommandIsNotStoredAfterANewerOne(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if _, err := (Topology{Subjects: subj}).Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	p, err := newEventPublisher(ctx, js, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(state, cmd string, cmdSeq uint64) error {
		_, err := p.Publish(ctx, messages.StateEvent{ID: "p1", State: state, Host: "h2", CommandID: cmd, CommandSeq: cmdSeq})
		return err
	}
	if err := publish(messages.StateDeleting, "c-delete", 5); err != nil {
		t.Fatal(err)
	}
	if err := publish(messages.StateRunning, "c-create", 9); err != nil {
		t.Fatal(err)
	}
	// The delete's last word comes late, from the old host.
	if err := publish(messages.StateDeleted, "c-delete", 5); !errors.Is(err, errEventSuperseded) {
		t.Errorf("the older command's event: %v, want errEventSuperseded", err)
	}
	last, _, err := p.last(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if last.State != messages.StateRunning || last.CommandID != "c-create" {
		t.Errorf("last event %s of %s, want running of c-create", last.State, last.CommandID)
	}
	// Events without a command sequence (older publishers) and of the
	// same command still go through.
	if err := publish(messages.StateRunning, "c-create", 9); err != nil {
		t.Errorf("the same command again: %v", err)
	}
	if err := publish(messages.StateFailed, "legacy", 0); err != nil {
		t.Errorf("an event without a command sequence: %v", err)
	}
}
