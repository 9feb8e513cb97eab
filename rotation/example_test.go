package rotation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/rotation"
	"proxyfleet/topology"
)

// Example follows the rotation of an embedded nats-server, with the
// topology set up as `proxyfleet setup` does and a health process
// publishing it, one proxy of a sim host reported running as a worker
// would, and picks it.
func Example() {
	t := &exampleTB{}
	defer t.done()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, js); err != nil {
		fmt.Println(err)
		return
	}
	h, err := health.New(js, health.Config{HTTPAddr: health.NoHTTP, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	hctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- h.Run(hctx) }()
	defer func() { stop(); <-ran }()
	ev, _ := json.Marshal(messages.StateEvent{V: 1, ID: "p1", State: messages.StateRunning, Host: "h1",
		IP: "198.18.100.32", Port: 3128, Source: messages.SourceSim, Seq: 1, At: time.Now()})
	if _, err := js.Publish(ctx, subj.State("p1"), ev); err != nil {
		fmt.Println(err)
		return
	}

	// The three lines.
	rot, err := rotation.Follow(ctx, nc, rotation.Config{User: "fleet", Password: "secret"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rot.Close()

	for { // until health has published p1
		ch := rot.Changed()
		if rot.Len() > 0 {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			fmt.Println(ctx.Err())
			return
		}
	}
	p, err := rot.Pick(rotation.Selector{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.ID, p.Addr, rot.ProxyURL(p))
	// Output: p1 198.18.100.32:3128 http://fleet:secret@198.18.100.32:3128
}

// exampleTB is the little of testing.TB that natstest needs, for an
// example, which has no *testing.T: a temp dir, cleanups, and a failure
// that panics.
type exampleTB struct {
	testing.TB // nil: any other method panics
	cleanups   []func()
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "rotation-example-")
	if err != nil {
		panic(err)
	}
	e.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// done runs the cleanups, last first.
func (e *exampleTB) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
