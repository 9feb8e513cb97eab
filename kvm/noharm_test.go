package kvm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// Issue 7, "do no harm": the provider never touches what is not its host
// entry's, and never reports a domain that is there as missing or refused
// because a read of it failed.

// definedProxy makes id's overlay, seed and marked domain through p and
// stops the create before the start (a hook, as a crash would): everything
// a proxy has, without booting a guest. The test's end deletes it through
// p.
func definedProxy(t *testing.T, env map[string]string, prefix string, mod func(*Options)) (*Provider, string) {
	t.Helper()
	p := newTestProvider(t, env, func(c *Options) {
		if mod != nil {
			mod(c)
		}
		c.Hooks.AfterDefine = func(string) error { return errors.New("test: stop before the start") }
	})
	id := testID(prefix)
	cleanupProxy(t, p, id)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := p.Create(ctx, testSpec(id)); !errors.Is(err, errHook) {
		t.Fatalf("create stopped by the hook: %v, want errHook", err)
	}
	return p, id
}

// artifacts reports which of id's domain, overlay and seed are on the host.
func artifacts(t *testing.T, p *Provider, id string) (domain, overlay, seed bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		_, err := l.DomainLookupByName(domainName(id))
		switch {
		case err == nil:
			domain = true
		case !isCode(err, libvirt.ErrNoDomain):
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("look up domain of %s: %v", id, err)
	}
	vols, err := p.ListVolumes(ctx)
	if err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	return domain, contains(vols, overlayVolumeName(id)), contains(vols, seedVolumeName(id))
}

// undefine removes id's domain behind the provider's back.
func undefine(t *testing.T, p *Provider, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		d, err := l.DomainLookupByName(domainName(id))
		if err != nil {
			return err
		}
		return l.DomainUndefine(d)
	})
	if err != nil {
		t.Errorf("undefine %s behind the provider's back: %v", id, err)
	}
}

// Two host entries on one daemon and one pool: the domain entry th1 made is
// not entry th2's, through Get, Create and Delete alike. th2 reports it not
// ours (permanent) and leaves the domain and its volumes as they are.
func TestProvider_anotherEntrysDomainIsNotOurs(t *testing.T) {
	env := testhostAll(t)
	a, id := definedProxy(t, env, "two", nil)
	b := newTestProvider(t, env, func(c *Options) { c.Host.Name = "th-other" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	notOurs := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrNotOurs) || fleet.ClassOf(err) != fleet.ClassPermanent {
			t.Errorf("%s through another entry: %v (class %q), want permanent ErrNotOurs", what, err, fleet.ClassOf(err))
			return
		}
		if !strings.Contains(err.Error(), `host entry "th1"`) {
			t.Errorf("%s through another entry: %v, want the reason to name the owning entry th1", what, err)
		}
	}
	in, err := b.Get(ctx, id)
	notOurs("get", err)
	if err == nil {
		t.Errorf("another entry's Get reported %+v", in)
	}
	_, err = b.Create(ctx, testSpec(id))
	notOurs("create", err)
	notOurs("delete", b.Delete(ctx, id))
	if list, err := b.List(ctx); err != nil || hasInstance(list, id) {
		t.Errorf("another entry's List: %+v %v, want it without %s", list, err, id)
	}

	if d, o, s := artifacts(t, a, id); !d || !o || !s {
		t.Fatalf("after another entry's get, create and delete: domain %v, overlay %v, seed %v; want all three untouched", d, o, s)
	}
	got, err := a.Get(ctx, id)
	if err != nil || got.Reason != reasonNeverStarted {
		t.Fatalf("the owning entry's Get: %+v %v, want its domain, defined and never started", got, err)
	}
	if err := a.Delete(ctx, id); err != nil {
		t.Fatalf("the owning entry's Delete: %v", err)
	}
	if d, o, s := artifacts(t, a, id); d || o || s {
		t.Fatalf("after the owner's delete: domain %v, overlay %v, seed %v; want none", d, o, s)
	}
}

// Once the domain was found, a read of it that fails is transient: never
// not-found (the worker would create a second one or report it gone) and
// never permanent (it would fail the proxy). Staged for real: the domain is
// undefined between the lookup and the read of its mark, and between the
// mark and the state.
func TestGet_readErrorOnAFoundDomainIsTransient(t *testing.T) {
	env := testhostAll(t)
	for _, at := range []string{hookLookedUp, hookMarked} {
		t.Run(at, func(t *testing.T) {
			p, id := definedProxy(t, env, "rd", nil)
			other := newTestProvider(t, env, nil)
			p.testHook = func(point, hid string) {
				if point == at && hid == id {
					undefine(t, other, id)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := p.Get(ctx, id)
			p.testHook = nil
			if fleet.ClassOf(err) != fleet.ClassTransient {
				t.Fatalf("Get with the domain gone after %s: %v (class %q), want transient", at, err, fleet.ClassOf(err))
			}
			t.Logf("read error after %s: %v", at, err)
			// The next read sees it gone, and Delete converges the volumes
			// it left.
			if _, err := p.Get(ctx, id); fleet.ClassOf(err) != fleet.ClassNotFound {
				t.Fatalf("Get after the domain went: %v, want not found", err)
			}
		})
	}
}

// Delete converges every artifact of the id, whether or not a domain is
// still there: a domain undefined behind its back leaves its volumes, and a
// delete interrupted after its undefine leaves them too; a Delete (a retry)
// removes them and only then says nil.
func TestDelete_convergesVolumesWithoutADomain(t *testing.T) {
	env := testhostAll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("undefined behind its back", func(t *testing.T) {
		p, id := definedProxy(t, env, "dv", nil)
		undefine(t, p, id)
		if d, o, s := artifacts(t, p, id); d || !o || !s {
			t.Fatalf("staging: domain %v, overlay %v, seed %v; want only the volumes", d, o, s)
		}
		if err := p.Delete(ctx, id); err != nil {
			t.Fatalf("delete without a domain: %v", err)
		}
		if d, o, s := artifacts(t, p, id); d || o || s {
			t.Fatalf("after delete: domain %v, overlay %v, seed %v; want none", d, o, s)
		}
	})

	t.Run("interrupted after the undefine", func(t *testing.T) {
		p, id := definedProxy(t, env, "di", nil)
		// The delete's caller gives up right after its domain call: the
		// undefine is done, the volume calls find the ctx done.
		dctx, dcancel := context.WithCancel(ctx)
		defer dcancel()
		fired := false
		p.testHook = func(point, hid string) {
			if point == hookUndefined && hid == id {
				fired = true
				dcancel()
			}
		}
		err := p.Delete(dctx, id)
		p.testHook = nil
		if !fired {
			t.Fatalf("the delete never reached its undefine (%v): the test proved nothing", err)
		}
		if fleet.ClassOf(err) != fleet.ClassTransient {
			t.Fatalf("interrupted delete: %v (class %q), want a transient error", err, fleet.ClassOf(err))
		}
		if d, o, s := artifacts(t, p, id); d || !o || !s {
			t.Fatalf("after the interrupted delete: domain %v, overlay %v, seed %v; want only the volumes", d, o, s)
		}
		if err := p.Delete(ctx, id); err != nil {
			t.Fatalf("retried delete: %v", err)
		}
		if d, o, s := artifacts(t, p, id); d || o || s {
			t.Fatalf("after the retried delete: domain %v, overlay %v, seed %v; want none", d, o, s)
		}
	})
}

// A create's call that makes something is not abandoned when the create's
// ctx is cancelled while it runs: the create waits for it, so its undo
// removes what it made. (Abandoned, the define would land after the undo
// looked for the domain: an orphan domain over deleted volumes.)
func TestCreate_cancelDuringDefineLeavesNothing(t *testing.T) {
	env := testhostAll(t)
	p := newTestProvider(t, env, nil)
	id := testID("cd")
	cleanupProxy(t, p, id)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned, defined := make(chan struct{}), make(chan struct{})
	p.testHook = func(point, hid string) {
		if hid != id {
			return
		}
		switch point {
		case hookDefining:
			// The caller gives up while the define is in flight; the call
			// is held until the caller has returned, or long enough for
			// it to have returned had it been abandoned.
			cancel()
			select {
			case <-returned:
			case <-time.After(2 * time.Second):
			}
		case hookDefineDone:
			close(defined)
		}
	}
	_, err := p.Create(ctx, testSpec(id))
	close(returned)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.Canceled) {
		t.Fatalf("create cancelled during its define: %v (class %q), want transient context.Canceled", err, fleet.ClassOf(err))
	}
	select {
	case <-defined:
	case <-time.After(30 * time.Second):
		t.Fatal("the define never finished")
	}
	p.testHook = nil
	if d, o, s := artifacts(t, p, id); d || o || s {
		t.Fatalf("after a create cancelled during its define: domain %v, overlay %v, seed %v; want none (its undo removes all it made)", d, o, s)
	}
}
