package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Config of one simulated host.
type Config struct {
	Host      string
	Dir       string
	Delay     time.Duration // added to every call
	BootDelay time.Duration // from create until the proxy has an address
	Now       func() time.Time
}

// Driver is one simulated host.
type Driver struct {
	cfg Config

	lockOnce sync.Once
	lockFile *os.File // locks/ids.lock, whose byte ranges lock ids across processes
	lockErr  error

	mu   sync.Mutex
	held map[string]chan struct{} // ids a call of this driver holds: closed when it ends
}

// domain is the file a created proxy leaves, its mark included.
type domain struct {
	ID        string    `json:"id"`
	Owner     string    `json:"owner"`
	CommandID string    `json:"command_id"`
	SpecHash  string    `json:"spec_hash"`
	Image     string    `json:"image"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mib"`
	CreatedAt time.Time `json:"created_at"`
	// Stopped simulates a domain that was shut off behind the system's back.
	Stopped bool `json:"stopped,omitempty"`
	// MAC and Egress are the static network the spec asked for (its
	// address of record first), as a kvm domain's interface and seed
	// keep them; absent for a proxy left to DHCP. Egress is in the
	// wire's compact form (messages.CompactEgress: sixteen IPv6
	// addresses in a row are one prefix), which reads back with two
	// address parses instead of seventeen.
	MAC    string       `json:"mac,omitempty"`
	Egress []string     `json:"egress,omitempty"`
	egress []netip.Addr // Egress read (read, Create)
}

// New opens (and makes) the host directory.
func New(cfg Config) (*Driver, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sim: dir is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, d := range []string{"domains", "volumes", "locks"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("sim %s: %w", cfg.Host, err)
		}
	}
	return &Driver{cfg: cfg, held: map[string]chan struct{}{}}, nil
}

func (d *Driver) domainPath(id string) string { return filepath.Join(d.cfg.Dir, "domains", id+".json") }

// VolumePath is where the simulated host keeps proxy id's volume.
func VolumePath(dir, id string) string { return filepath.Join(dir, "volumes", id+".disk") }

// lock takes the id's lock, recording an overlap if it was already held.
// The returned func releases it.
//
// Across processes, and across drivers of one directory, it is a write
// lock on one byte of locks/ids.lock, at an offset hashed from the id: an
// open file description's lock (F_OFD_SETLK), dropped when the process
// dies. One such lock does not exclude the calls of its own open file, so
// within this driver a call waits for its other call of the id first.
// One file opened once, not a file per id opened at every call, so a call
// costs no open (docs/DECISIONS.md, "The sim locks an id in one file").
func (d *Driver) lock(ctx context.Context, op, id string) (func(), error) {
	d.lockOnce.Do(func() {
		d.lockFile, d.lockErr = os.OpenFile(filepath.Join(d.cfg.Dir, "locks", "ids.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	})
	if d.lockErr != nil {
		return nil, fleet.Transient(fmt.Errorf("sim lock %s: %w", id, d.lockErr))
	}
	overlap := func() {
		appendLine(filepath.Join(d.cfg.Dir, "overlaps.log"), fmt.Sprintf("%s %s %d", id, op, os.Getpid()))
	}
	recorded := false
	d.mu.Lock()
	for {
		busy, ok := d.held[id]
		if !ok {
			break
		}
		if !recorded {
			overlap()
			recorded = true
		}
		d.mu.Unlock()
		<-busy
		d.mu.Lock()
	}
	done := make(chan struct{})
	d.held[id] = done
	d.mu.Unlock()
	release := func() {
		d.mu.Lock()
		delete(d.held, id)
		close(done)
		d.mu.Unlock()
	}
	lk := idLock(id)
	fd := d.lockFile.Fd()
	if err := unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk); err != nil {
		if !recorded {
			overlap()
		}
		if err := unix.FcntlFlock(fd, unix.F_OFD_SETLKW, &lk); err != nil {
			release()
			return nil, fleet.Transient(fmt.Errorf("sim lock %s: %w", id, err))
		}
	}
	return func() {
		un := lk
		un.Type = unix.F_UNLCK
		_ = unix.FcntlFlock(fd, unix.F_OFD_SETLK, &un)
		release()
	}, nil
}

// appendLine appends one short line atomically (O_APPEND, one write).
func appendLine(path, line string) {
	_ = writeWhole(path, unix.O_APPEND, []byte(line+"\n"))
}

// writeWhole writes b to the file at path, made if missing (mode 0644),
// opened with the extra flag (O_TRUNC or O_APPEND), with open, write and
// close only, as readWhole reads.
func writeWhole(path string, flag int, b []byte) error {
	fd, err := ignoringEINTR(func() (int, error) {
		return unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC|flag, 0o644)
	})
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	for len(b) > 0 {
		n, err := ignoringEINTR(func() (int, error) { return unix.Write(fd, b) })
		if err != nil {
			unix.Close(fd)
			return &os.PathError{Op: "write", Path: path, Err: err}
		}
		b = b[n:]
	}
	if err := unix.Close(fd); err != nil {
		return &os.PathError{Op: "close", Path: path, Err: err}
	}
	return nil
}

func (d *Driver) pause(ctx context.Context, dur time.Duration) error {
	if dur <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fleet.Transient(fmt.Errorf("sim %s: %w", d.cfg.Host, ctx.Err()))
	}
}

// enter runs the common prologue of a call: lock, delay, injected fault.
func (d *Driver) enter(ctx context.Context, op, id string) (func(), error) {
	unlock, err := d.lock(ctx, op, id)
	if err != nil {
		return nil, err
	}
	if err := d.pause(ctx, d.cfg.Delay); err != nil {
		unlock()
		return nil, err
	}
	if err := takeFault(d.cfg.Dir, op, id); err != nil {
		unlock()
		return nil, fmt.Errorf("%s %s on %s: %w", op, id, d.cfg.Host, err)
	}
	return unlock, nil
}

// read reads id's domain file, its egress addresses expanded.
func (d *Driver) read(id string) (domain, error) {
	dom, err := d.readMark(id)
	if err != nil {
		return dom, err
	}
	if dom.egress, err = messages.ExpandEgress(dom.Egress); err != nil {
		return domain{}, fleet.Permanent(fmt.Errorf("read domain %s: %w", id, err))
	}
	return dom, nil
}

// readMark reads id's domain file and leaves its egress in the compact
// form it is stored in.
func (d *Driver) readMark(id string) (domain, error) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	b, err := readWhole(d.domainPath(id), bp)
	if errors.Is(err, os.ErrNotExist) {
		return domain{}, fleet.NotFound(fmt.Errorf("proxy %s on %s: no domain", id, d.cfg.Host))
	}
	if err != nil {
		return domain{}, fleet.Transient(fmt.Errorf("read domain %s: %w", id, err))
	}
	var dom domain
	if err := json.Unmarshal(b, &dom); err != nil {
		return domain{}, fleet.Permanent(fmt.Errorf("read domain %s: %w", id, err))
	}
	return dom, nil
}

// readBufs holds the buffers domain files are read into; json.Unmarshal
// copies what it keeps, so a buffer goes back once the file is decoded.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// readWhole reads the file at path into *bp (grown if it must be) with
// open, read and close only: no os.File, whose making costs an fstat and
// a try at the poller for a regular file, and no fstat to size the
// buffer. A domain file is never written in place (write renames a whole
// new file over it), so a read that does not fill the buffer has read
// the whole file. A missing file is an error that matches os.ErrNotExist.
func readWhole(path string, bp *[]byte) ([]byte, error) {
	fd, err := ignoringEINTR(func() (int, error) { return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0) })
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := *bp
	n := 0
	for {
		m, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, buf[n:]) })
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		n += m
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = append(buf, make([]byte, len(buf))...)
		*bp = buf
	}
}

func ignoringEINTR(call func() (int, error)) (int, error) {
	for {
		n, err := call()
		if err != unix.EINTR {
			return n, err
		}
	}
}

func (d *Driver) instance(dom domain) fleet.Instance {
	in := fleet.Instance{
		ID: dom.ID, CommandID: dom.CommandID, SpecHash: dom.SpecHash, CreatedAt: dom.CreatedAt,
		State: messages.StateProvisioning,
	}
	switch {
	case dom.Stopped:
		in.State = messages.StateFailed
		in.Reason = "domain is shut off"
	case !d.cfg.Now().Before(dom.CreatedAt.Add(d.cfg.BootDelay)):
		in.State = messages.StateRunning
		in.IP = SimIP(dom.ID)
		in.Source = messages.SourceSim
	}
	in.Egress = dom.egress
	if in.State == messages.StateRunning && len(dom.Egress) > 0 {
		// The plan's address of record (its first), still of source
		// sim: health never probes a simulated proxy.
		in.IP = firstEgress(dom.Egress[0])
	}
	return in
}

// firstEgress is the first address of an item of a compact egress list
// (an address, or a prefix standing for its addresses).
func firstEgress(item string) string {
	if p, err := netip.ParsePrefix(item); err == nil {
		return p.Addr().String()
	}
	return item
}

// SimIP is the made-up address of a simulated proxy: 198.19.x.y, inside the
// benchmarking range 198.18.0.0/15, and never sent traffic.
func SimIP(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	v := h.Sum32()
	return fmt.Sprintf("198.19.%d.%d", (v>>8)&0xff, v&0xff%254+1)
}

// Create writes the domain file unless a marked one exists already.
func (d *Driver) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	unlock, err := d.enter(ctx, "create", spec.ID)
	if err != nil {
		return fleet.Instance{}, err
	}
	defer unlock()
	if dom, err := d.read(spec.ID); err == nil {
		return d.instance(dom), nil
	} else if fleet.ClassOf(err) != fleet.ClassNotFound {
		return fleet.Instance{}, err
	}
	if err := writeWhole(VolumePath(d.cfg.Dir, spec.ID), unix.O_TRUNC, []byte(spec.CommandID)); err != nil {
		return fleet.Instance{}, fleet.Transient(fmt.Errorf("create volume %s: %w", spec.ID, err))
	}
	dom := domain{
		ID: spec.ID, Owner: "proxyfleet", CommandID: spec.CommandID, SpecHash: spec.SpecHash,
		Image: spec.Image, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB, CreatedAt: d.cfg.Now().UTC(),
	}
	if spec.Network.Static() {
		dom.MAC, dom.egress = spec.Network.MAC, spec.Network.Egress()
		dom.Egress = messages.CompactEgress(dom.egress)
	}
	if err := d.write(dom); err != nil {
		return fleet.Instance{}, err
	}
	appendLine(filepath.Join(d.cfg.Dir, "creates.log"), spec.ID+" "+spec.CommandID)
	return d.instance(dom), nil
}

func (d *Driver) write(dom domain) error {
	b, _ := json.Marshal(dom)
	tmp := d.domainPath(dom.ID) + ".tmp"
	if err := writeWhole(tmp, unix.O_TRUNC, b); err != nil {
		return fleet.Transient(fmt.Errorf("write domain %s: %w", dom.ID, err))
	}
	if err := os.Rename(tmp, d.domainPath(dom.ID)); err != nil {
		return fleet.Transient(fmt.Errorf("write domain %s: %w", dom.ID, err))
	}
	return nil
}

// Get reads the domain file.
func (d *Driver) Get(ctx context.Context, id string) (fleet.Instance, error) {
	unlock, err := d.enter(ctx, "get", id)
	if err != nil {
		return fleet.Instance{}, err
	}
	defer unlock()
	dom, err := d.read(id)
	if err != nil {
		return fleet.Instance{}, err
	}
	return d.instance(dom), nil
}

// Delete removes the domain file, then the volume; absent ones are success.
func (d *Driver) Delete(ctx context.Context, id string) error {
	unlock, err := d.enter(ctx, "delete", id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(d.domainPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fleet.Transient(fmt.Errorf("delete domain %s: %w", id, err))
	}
	if err := takeFault(d.cfg.Dir, "delete-volumes", id); err != nil {
		return fmt.Errorf("delete %s on %s: volumes: %w", id, d.cfg.Host, err)
	}
	if err := os.Remove(VolumePath(d.cfg.Dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fleet.Transient(fmt.Errorf("delete volume %s: %w", id, err))
	}
	return nil
}

// List reads every domain file.
func (d *Driver) List(ctx context.Context) ([]fleet.Instance, error) {
	if err := d.pause(ctx, d.cfg.Delay); err != nil {
		return nil, err
	}
	if err := takeFault(d.cfg.Dir, "list", ""); err != nil {
		return nil, fmt.Errorf("list %s: %w", d.cfg.Host, err)
	}
	names, err := filepath.Glob(filepath.Join(d.cfg.Dir, "domains", "*.json"))
	if err != nil {
		return nil, fleet.Transient(err)
	}
	sort.Strings(names)
	var out []fleet.Instance
	for _, n := range names {
		// A summary, as Provider.List promises: the egress addresses are
		// Get's to expand (every observation pass lists every domain).
		dom, err := d.readMark(strings.TrimSuffix(filepath.Base(n), ".json"))
		if fleet.ClassOf(err) == fleet.ClassNotFound {
			continue // deleted while listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d.instance(dom))
	}
	return out, nil
}

// idLock is the write lock of id's byte of locks/ids.lock.
func idLock(id string) unix.Flock_t {
	h := fnv.New64a()
	h.Write([]byte(id))
	return unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(h.Sum64() >> 2), Len: 1}
}

// Busy reports whether a call for id holds its lock on the simulated host
// in dir, in any driver of any process (for tests that act while a call
// is in flight).
func Busy(dir, id string) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, "locks", "ids.lock"), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // no call yet
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	lk := idLock(id)
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// Close releases the lock file; calls after it fail.
func (d *Driver) Close() error {
	d.lockOnce.Do(func() { d.lockErr = errors.New("driver closed") })
	if d.lockFile == nil {
		return nil
	}
	return d.lockFile.Close()
}

// Stop marks a proxy's domain shut off, as if it died behind the system's
// back (for tests and demos).
func (d *Driver) Stop(id string) error {
	dom, err := d.read(id)
	if err != nil {
		return err
	}
	dom.Stopped = true
	return d.write(dom)
}
