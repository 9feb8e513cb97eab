package kvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/config"
	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Config of the provider of one host entry.
type Config struct {
	Host   config.Host
	Images []config.Image
	Proxy  config.Proxy
	Logger *slog.Logger
	Now    func() time.Time
	// OnProgress, if set, hears of base image transfers.
	OnProgress func(Progress)
	// Link overrides the link built from Host (tests).
	Link *LinkConfig
	// Hooks run at named points of a create (tests stage crashes there).
	Hooks Hooks
}

// Hooks are called at named points of Create. A hook that returns an error
// fails the create there, as a crash would leave it (no clean-up runs).
type Hooks struct {
	// AfterOverlay runs after the overlay and seed volumes are made,
	// before the domain is defined.
	AfterOverlay func(id string) error
	// AfterDefine runs after the domain is defined, before it is started.
	AfterDefine func(id string) error
}

// Provider runs proxies on one host through its libvirt daemon. It keeps
// no per-proxy state: everything it reports is read back from libvirt, the
// domain's mark included (DESIGN.md, "read back, not remembered").
type Provider struct {
	cfg    Config
	link   *Link
	images *imageCache
	byName map[string]config.Image
	log    *slog.Logger

	mu        sync.Mutex
	listeners map[int]func(Progress) // creates waiting on an image transfer
	nextL     int

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

// LinkConfigFor is the link configuration of a host entry.
func LinkConfigFor(h config.Host) LinkConfig {
	return LinkConfig{
		SSH: SSHConfig{
			Host: h.Name, Address: h.SSH.Address, User: h.SSH.User, KeyFile: h.SSH.KeyFile,
			KnownHostsFile: h.SSH.KnownHosts, Socket: h.Socket,
			ConnectTimeout: h.Budgets.Connect, KeepaliveInterval: h.Budgets.Keepalive,
		},
		URI:     h.URI,
		Budgets: Budgets{Call: h.Budgets.Call, Connect: h.Budgets.Connect, TransferStall: h.Budgets.TransferStall, Close: h.Budgets.Close},
	}
}

// New returns the provider of cfg.Host. It dials on first use, so a worker
// that never owns this host never opens a link to it.
func New(cfg Config) (*Provider, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := checkHostEntry(cfg.Host.Name); err != nil {
		return nil, fleet.Permanent(fmt.Errorf("kvm provider: %w", err))
	}
	lc := LinkConfigFor(cfg.Host)
	if cfg.Link != nil {
		lc = *cfg.Link
	}
	link, err := NewLink(lc)
	if err != nil {
		return nil, fmt.Errorf("kvm provider %s: %w", cfg.Host.Name, err)
	}
	p := &Provider{cfg: cfg, link: link, byName: map[string]config.Image{}, log: cfg.Logger.With("host", cfg.Host.Name)}
	for _, im := range cfg.Images {
		p.byName[im.Name] = im
	}
	p.images = &imageCache{
		host: cfg.Host.Name, pool: cfg.Host.Pool, link: link, budgets: link.cfg.Budgets,
		httpClient: http.DefaultClient, log: p.log, onProgress: p.progress,
	}
	return p, nil
}

// progress hands a transfer's progress to the configured listener and to
// every create waiting for it. It must not block.
func (p *Provider) progress(pr Progress) {
	if p.cfg.OnProgress != nil {
		p.cfg.OnProgress(pr)
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
// and reported, not made again. A failed create removes what it made.
func (p *Provider) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	img, ok := p.byName[spec.Image]
	if !ok {
		return fleet.Instance{}, fleet.Permanent(fmt.Errorf("create %s: unknown image %q", spec.ID, spec.Image))
	}
	if err := checkID(spec.ID); err != nil {
		return fleet.Instance{}, fleet.Permanent(fmt.Errorf("create %s: %w", spec.ID, err))
	}
	in, err := p.Get(ctx, spec.ID)
	switch {
	case err == nil:
		if in.State == messages.StateFailed && in.Reason == reasonNeverStarted {
			// A create that stopped between define and start: finish it.
			if err := p.start(ctx, spec.ID); err != nil {
				return fleet.Instance{}, err
			}
			return p.Get(ctx, spec.ID)
		}
		return in, nil
	case fleet.ClassOf(err) != fleet.ClassNotFound:
		return fleet.Instance{}, err
	}
	stop := p.listen(func(pr Progress) {
		if pr.Image == img.Name {
			fleet.ReportProgress(ctx, progressMessage(pr))
		}
	})
	vols, err := p.images.ensure(ctx, img)
	stop()
	if err != nil {
		return fleet.Instance{}, fmt.Errorf("create %s: image %s: %w", spec.ID, img.Name, err)
	}
	made := &made{}
	if err := p.create(ctx, spec, img, vols, made); err != nil {
		if !errors.Is(err, errHook) {
			p.undo(spec.ID, made)
		}
		return fleet.Instance{}, err
	}
	return p.Get(ctx, spec.ID)
}

// errHook marks a failure staged by a test hook: like a crash, it leaves
// what was made for the next create or a sweep to find.
var errHook = errors.New("stopped by a hook")

// made records what one create made, for undo.
type made struct {
	overlay, seed, domain bool
}

const reasonNeverStarted = "defined, never started"

func (p *Provider) create(ctx context.Context, spec fleet.Spec, img config.Image, vols imageVolumes, m *made) error {
	id, pool := spec.ID, p.cfg.Host.Pool
	// Leftovers of a create that died before its domain was defined carry
	// our names and no domain refers to them: remove them first.
	for _, name := range []string{overlayVolumeName(id), seedVolumeName(id)} {
		if err := p.deleteVolume(ctx, name); err != nil {
			return fmt.Errorf("create %s: remove leftover %s: %w", id, name, err)
		}
	}
	overlayXML, err := overlayVolumeXML(id, vols.Base.Capacity, vols.Base.Path, vols.Base.Format)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		_, err = l.StorageVolCreateXML(sp, overlayXML, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("create %s: overlay: %w", id, err)
	}
	m.overlay = true

	ud, err := userData(p.cfg.Proxy.UserData, id, id)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	iso, err := seedISO(instanceID(spec), id, ud)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	if err := p.uploadSeed(ctx, id, iso, m); err != nil {
		return err
	}
	if h := p.cfg.Hooks.AfterOverlay; h != nil {
		if err := h(id); err != nil {
			return fmt.Errorf("create %s: %w: %w", id, errHook, err)
		}
	}

	params := domainParams{
		Type: p.cfg.Host.DomainType, ID: id, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB,
		Network: p.cfg.Host.Network,
		Disk:    diskRef{Pool: pool, Volume: overlayVolumeName(id)},
		Seed:    diskRef{Pool: pool, Volume: seedVolumeName(id)},
		Cmdline: img.Cmdline,
		Mark: mark{
			Owner: markOwner, ID: id, CommandID: spec.CommandID, SpecHash: spec.SpecHash,
			CreatedAt: p.cfg.Now().UTC(), Host: p.cfg.Host.Name, Image: img.Name, Labels: spec.Labels,
		},
	}
	if vols.Kernel != nil {
		params.Kernel = vols.Kernel.Path
	}
	if vols.Initrd != nil {
		params.Initrd = vols.Initrd.Path
	}
	xml, err := domainXML(params)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		p.hook(hookDefining, id)
		_, err := l.DomainDefineXML(xml)
		p.hook(hookDefineDone, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("define domain %s: %w", id, err)
	}
	m.domain = true
	if h := p.cfg.Hooks.AfterDefine; h != nil {
		if err := h(id); err != nil {
			return fmt.Errorf("create %s: %w: %w", id, errHook, err)
		}
	}
	return p.start(ctx, id)
}

// instanceID changes whenever the proxy is made anew, so cloud-init in the
// guest runs its per-instance modules again.
func instanceID(spec fleet.Spec) string {
	h := spec.SpecHash
	if len(h) > 12 {
		h = h[:12]
	}
	if h == "" {
		return spec.ID
	}
	return spec.ID + "-" + h
}

func (p *Provider) uploadSeed(ctx context.Context, id string, iso []byte, m *made) error {
	pool, name := p.cfg.Host.Pool, seedVolumeName(id)
	volXML, err := plainVolumeXML(name, uint64(len(iso)), "raw")
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	var vol libvirt.StorageVol
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		vol, err = l.StorageVolCreateXML(sp, volXML, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("create %s: seed volume: %w", id, err)
	}
	m.seed = true
	err = p.link.transfer(ctx, bytes.NewReader(iso), func(l *libvirt.Libvirt, r io.Reader) error {
		return l.StorageVolUpload(vol, r, 0, uint64(len(iso)), 0)
	})
	if err != nil {
		return fmt.Errorf("create %s: upload seed: %w", id, err)
	}
	return nil
}

func (p *Provider) start(ctx context.Context, id string) error {
	err := p.mutate(ctx, func(l *libvirt.Libvirt) error {
		d, err := l.DomainLookupByName(domainName(id))
		if err != nil {
			return err
		}
		return l.DomainCreate(d)
	})
	if err != nil {
		return fmt.Errorf("start domain %s: %w", id, err)
	}
	return nil
}

// undo removes what a failed create made. It runs on its own budget: the
// create's ctx may be what failed.
func (p *Provider) undo(id string, m *made) {
	if !m.overlay && !m.seed && !m.domain {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*p.link.cfg.Budgets.Call)
	defer cancel()
	if err := p.Delete(ctx, id); err != nil {
		p.log.Error("clean up failed create", "id", id, "err", err)
	}
}

func poolErr(pool string, err error) error {
	if fleet.ClassOf(Classify(err)) == fleet.ClassNotFound {
		// A missing pool is the config's fault, not a missing proxy.
		return fleet.Permanent(fmt.Errorf("storage pool %q: %w", pool, err))
	}
	return err
}

// Delete converges every artifact of id on this host entry to absent
// before it returns nil: the domain pf-<id> (found by name and checked by
// its mark) is destroyed and undefined, and the overlay pf-<id>-disk.qcow2
// and the seed pf-<id>-seed.iso are removed from the entry's pool, whether
// or not a domain is still there (a create that died before its define, a
// delete interrupted after the undefine, a domain undefined behind our
// back). Each step treats "already gone" as done, so a retried delete picks
// up where an interrupted one stopped, and a proxy with nothing left is
// success.
//
// A domain pf-<id> that is not this entry's (unmarked, another
// application's, or marked by another host entry on the same daemon) is
// refused with ErrNotOurs (permanent), and then neither the domain nor the
// volumes of its id are touched: they belong with it. Any other error
// leaves what is not yet removed for the retry.
func (p *Provider) Delete(ctx context.Context, id string) error {
	dom, _, err := p.lookup(ctx, id)
	switch {
	case fleet.ClassOf(err) == fleet.ClassNotFound:
	case err != nil:
		return err
	default:
		err := p.call(ctx, func(l *libvirt.Libvirt) error {
			if err := l.DomainDestroy(dom); err != nil && !isCode(err, libvirt.ErrOperationInvalid) && !isCode(err, libvirt.ErrNoDomain) {
				return fmt.Errorf("destroy: %w", err)
			}
			err := l.DomainUndefineFlags(dom, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineSnapshotsMetadata|libvirt.DomainUndefineNvram)
			if err != nil && !isCode(err, libvirt.ErrNoDomain) {
				return fmt.Errorf("undefine: %w", err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("delete domain %s: %w", id, err)
		}
		p.hook(hookUndefined, id)
	}
	for _, name := range []string{overlayVolumeName(id), seedVolumeName(id)} {
		if err := p.deleteVolume(ctx, name); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}
	return nil
}

func isCode(err error, code libvirt.ErrorNumber) bool {
	var le libvirt.Error
	return errors.As(err, &le) && le.Code == uint32(code)
}

// deleteVolume removes a volume of ours by name; an absent one is success.
func (p *Provider) deleteVolume(ctx context.Context, name string) error {
	pool := p.cfg.Host.Pool
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		v, err := l.StorageVolLookupByName(sp, name)
		if isCode(err, libvirt.ErrNoStorageVol) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := l.StorageVolDelete(v, 0); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return nil
}

// List returns every domain this host entry made (by its mark), with its
// state (no address: that costs a call per source; Get reads it). Domains
// another entry on the same daemon made are left out, so a sweep of one
// entry never touches another's.
func (p *Provider) List(ctx context.Context) ([]fleet.Instance, error) {
	var doms []libvirt.Domain
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		var err error
		doms, _, err = l.ConnectListAllDomains(1, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []fleet.Instance
	for _, d := range doms {
		id, ok := parseDomainName(d.Name)
		if !ok {
			continue
		}
		_, m, err := p.lookup(ctx, id)
		if fleet.ClassOf(err) == fleet.ClassNotFound || errors.Is(err, ErrNotOurs) {
			continue // gone meanwhile, or not ours: another host entry's, say
		}
		if err != nil {
			return nil, err
		}
		in := m.instance()
		var state int32
		err = p.call(ctx, func(l *libvirt.Libvirt) error {
			var err error
			state, _, err = l.DomainGetState(d, 0)
			return err
		})
		if fleet.ClassOf(err) == fleet.ClassNotFound {
			continue
		}
		if err != nil {
			return nil, fleet.Transient(fmt.Errorf("state of %s: %w", id, err))
		}
		switch libvirt.DomainState(state) {
		case libvirt.DomainRunning, libvirt.DomainBlocked, libvirt.DomainPaused:
			in.State = messages.StateProvisioning // active; Get reads whether it has an address
		default:
			in.State, in.Reason = messages.StateFailed, "domain is not running"
		}
		out = append(out, in)
	}
	return out, nil
}

// ListVolumes returns the names of every volume in the host's pool that
// this project made (proxies' overlays and seeds, cached images).
func (p *Provider) ListVolumes(ctx context.Context) ([]string, error) {
	pool := p.cfg.Host.Pool
	var names []string
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		if err := l.StoragePoolRefresh(sp, 0); err != nil {
			return err
		}
		vols, _, err := l.StoragePoolListAllVolumes(sp, 1, 0)
		if err != nil {
			return err
		}
		for _, v := range vols {
			if isOurs(v.Name) {
				names = append(names, v.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return names, nil
}
