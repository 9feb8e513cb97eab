package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// Provider runs proxies on one host through its libvirt daemon. It keeps
// no per-proxy state: everything it reports is read back from libvirt, the
// domain's mark included (DESIGN.md, "read back, not remembered").
type Provider struct {
	opts   Options
	link   *Link
	images *imageCache
	byName map[string]ImageSource
	log    *slog.Logger

	mu        sync.Mutex
	listeners map[int]func(Progress) // creates waiting on an image transfer
	nextL     int
	sweepSeen map[string]sweepSeen // volumes seen unused (sweep.go)

	// testHook, if set (in-package tests only), runs at named points of a
	// read, create or delete: hookLookedUp inside lookup's call, after the
	// domain was found and before its mark is read; hookMarked in Get,
	// after the mark was read and before the state is; hookDefining and
	// hookDefineDone inside the define's call, around DomainDefineXML;
	// hookUndefined in Delete, after the domain is undefined and before the
	// volumes are removed.
	testHook func(point, id string)
}

const (
	hookLookedUp   = "looked-up"
	hookMarked     = "marked"
	hookDefining   = "defining"
	hookDefineDone = "define-done"
	hookUndefined  = "undefined"
)

func (p *Provider) hook(point, id string) {
	if p.testHook != nil {
		p.testHook(point, id)
	}
}

// ErrNotOurs is returned for a domain with one of our names that carries no
// mark of this host entry (no mark, another application's, an unreadable
// one, or one that names another host entry on the same daemon): the
// provider never touches it, nor the volumes of its id.
var ErrNotOurs = errors.New("not made by proxyfleet")

// New returns the provider of opts.Host. A bad option is a permanent
// *OptionError. It dials on first use, so a worker that never owns this
// host never opens a link to it.
func New(opts Options) (*Provider, error) {
	if err := opts.Validate(); err != nil {
		return nil, fleet.Permanent(fmt.Errorf("kvm provider %s: %w", opts.Host.Name, err))
	}
	opts = opts.WithDefaults()
	lc := opts.Host.linkConfig()
	if opts.Link != nil {
		lc = *opts.Link
	}
	if lc.Observer == nil {
		lc.Observer = opts.Observer
	}
	link, err := NewLink(lc)
	if err != nil {
		return nil, fmt.Errorf("kvm provider %s: %w", opts.Host.Name, err)
	}
	p := &Provider{opts: opts, link: link, byName: map[string]ImageSource{}, log: opts.Logger.With("host", opts.Host.Name)}
	for _, im := range opts.Images {
		p.byName[im.Name] = im
	}
	p.images = &imageCache{
		host: opts.Host.Name, pool: opts.Host.Pool, link: link, budgets: link.cfg.Budgets,
		httpClient: http.DefaultClient, log: p.log, onProgress: p.progress,
	}
	return p, nil
}

// progress hands a transfer's progress to the configured listener and to
// every create waiting for it. It must not block.
func (p *Provider) progress(pr Progress) {
	if p.opts.OnProgress != nil {
		p.opts.OnProgress(pr)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.listeners {
		f(pr)
	}
}

// listen adds f to the progress listeners until the returned func is called.
func (p *Provider) listen(f func(Progress)) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listeners == nil {
		p.listeners = map[int]func(Progress){}
	}
	k := p.nextL
	p.nextL++
	p.listeners[k] = f
	return func() {
		p.mu.Lock()
		delete(p.listeners, k)
		p.mu.Unlock()
	}
}

// progressMessage says what a transfer is doing, for a provisioning event.
func progressMessage(pr Progress) string {
	const mib = 1 << 20
	return fmt.Sprintf("uploading image %s to %s: %.1f of %.1f MiB at %.1f MiB/s",
		pr.Image, pr.Volume, float64(pr.Done)/mib, float64(pr.Total)/mib, pr.Rate/mib)
}

// Close closes the host's links.
func (p *Provider) Close() error { return p.link.Close() }

func (p *Provider) call(ctx context.Context, fn func(l *libvirt.Libvirt) error) error {
	return p.link.call(ctx, 0, fn)
}

// mutate runs a call of a create that makes something (a volume, the domain,
// its start). Unlike call it is never abandoned once it started: a caller
// whose ctx is done while it runs still waits for it (within its budget),
// so that what the create made is known when it returns, and its undo
// removes what the call made instead of racing it (an abandoned define
// landing after the undo looked for the domain would leave an orphan). ctx
// is checked before the call starts.
func (p *Provider) mutate(ctx context.Context, fn func(l *libvirt.Libvirt) error) error {
	if err := ctx.Err(); err != nil {
		return fleet.Transient(fmt.Errorf("libvirt %s: %w", p.link.name, err))
	}
	return p.link.call(context.WithoutCancel(ctx), 0, fn)
}

// Create makes the proxy's overlay and seed, defines its domain with the
// mark, and starts it. A marked domain already there is started if needed

func poolErr(pool string, err error) error {
	if fleet.ClassOf(Classify(err)) == fleet.ClassNotFound {
		// A missing pool is the config's fault, not a missing proxy.
		return fleet.Permanent(fmt.Errorf("storage pool %q: %w", pool, err))
	}
	return err
}

func isCode(err error, code libvirt.ErrorNumber) bool {
	var le libvirt.Error
	return errors.As(err, &le) && le.Code == uint32(code)
}

// EnsureImage makes sure the named image is in the host's cache, uploaded,
// verified and marked, as the first create from it does: it warms a host
// ahead of its first proxy. An image not configured is a permanent error.
func (p *Provider) EnsureImage(ctx context.Context, name string) error {
	img, ok := p.byName[name]
	if !ok {
		return fleet.Permanent(fmt.Errorf("ensure image: unknown image %q", name))
	}
	if _, err := p.images.ensure(ctx, img); err != nil {
		return fmt.Errorf("ensure image %s: %w", name, err)
	}
	return nil
}
