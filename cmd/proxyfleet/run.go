package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sync/errgroup"
)

// A role is made of components, each a Run(ctx) error that runs until ctx
// is done and then stops (a worker drains), or fails. runAll runs a role's
// components together; the process ends when they have all returned.

// component is one part of a role.
type component struct {
	name string
	run  func(context.Context) error
}

// errStoppedByItself is what runAll makes of a component that returned
// nil while it was meant to run: the process must not go on without it.
var errStoppedByItself = errors.New("stopped by itself")

// runAll runs comps until ctx is done, then waits for them to stop and
// returns nil. When one fails (or returns by itself), the others are
// stopped as on a signal, and runAll returns that first failure, named by
// its component.
func runAll(ctx context.Context, log *slog.Logger, comps ...component) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range comps {
		g.Go(func() error {
			err := c.run(gctx)
			if err == nil && gctx.Err() == nil {
				err = errStoppedByItself
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", c.name, err)
				log.Error(c.name+" failed: stopping the other components", "err", err)
			}
			return err
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			log.Info("stopping (a second SIGINT or SIGTERM exits at once)")
		}
		return nil
	})
	return g.Wait()
}

// signalContext returns a context cancelled by the first SIGINT or
// SIGTERM, on which the process drains and stops. A second one ends the
// process at once, with status 128 plus the signal's number. stop undoes
// it.
func signalContext(stderr io.Writer) (ctx context.Context, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			fmt.Fprintf(stderr, "proxyfleet: %v again: exiting at once\n", s)
			code := 1
			if n, ok := s.(syscall.Signal); ok {
				code = 128 + int(n)
			}
			os.Exit(code)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// watchEmbedded is the component of serve's embedded nats-server: it
// returns nil once ctx is done, or an error once the server has stopped or
// its JetStream is off, without which no role can work. (The server is
// shut down after every other component has stopped, since they drain
// through it.)
func watchEmbedded(s *server.Server) component {
	return component{"nats-server", func(ctx context.Context) error {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			switch {
			case !s.Running():
				return errors.New("the embedded server stopped")
			case !s.JetStreamEnabled():
				return errors.New("JetStream of the embedded server is off")
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}}
}
