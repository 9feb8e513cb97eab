package worker

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// hostView is the worker's picture of every host's record in PROXY_HOSTS,
// for placement to rank the hosts by free room without reading every
// record for every create (with 20 hosts that was 20 reads and decodes of
// up to max_proxies entries each per command, a third of a busy worker's
// CPU).
//
// A KV watcher of the bucket feeds it, and this worker's own writes
// (hostWriter) are put in as soon as the server stored them, so its own
// placements see each other at once; a record is replaced only by one of
// a higher revision. It may lag behind the bucket for other workers'
// writes: it only ranks, and gives the writers their first guess of a
// record. Every reservation is stored by a compare-and-set on the revision
// of the record it was judged on (hostWriter.apply), which refuses a host
// that is full or quarantined, and placement goes on to the next host; a
// host the view says is full or quarantined is read afresh before
// placement passes it over (a view behind a bucket made anew must not turn
// a create away). Until the watcher has delivered every record, placement
// reads them as before. Of a record another worker wrote, the view decodes
// at once only what ranking needs (messages.DecodeHostRoom), and the whole
// record when this worker first asks for it (latest, at, record).
type hostView struct {
	kv    jetstream.KeyValue
	nc    *nats.Conn // kv's, for jsapi.StopWatcher
	retry time.Duration
	log   *slog.Logger

	mu    sync.Mutex
	ready bool // every record delivered since the watch began
	recs  map[string]viewedHost
	// holders is a counting filter of the proxy ids in recs: a counter
	// per slot, each id counted in the slot its hash picks, once for
	// every record that holds room for it. Nearly every create is of an
	// id no host holds, so each asks this once instead of looking the id
	// up in every host's record; an id whose slot counts others (about
	// one in ten, at eight slots an id) is looked up in each record,
	// which costs only time, never a wrong answer. A byte a slot, eight
	// slots an id (docs/DECISIONS.md, "The host view counts held ids in a
	// filter"). Kept up as records are replaced, by a diff of the old and
	// the new record, O(record), and made anew, larger, when the ids
	// outgrow it.
	holders []uint8
	holderN int // ids counted (an id once per record holding it)
	seed    maphash.Seed

	// order is the catalog's hosts, and inOrder their records in that order
	// (rev 0: none), kept beside recs: placement ranks every host for
	// every create, and walking a slice cost a fifth of looking each host
	// up by name (500 lookups a create, 8% of a busy worker's CPU). pos
	// is each one's index.
	order   []string
	pos     map[string]int
	inOrder []viewedHost
}

// viewedHost is what the view holds of a host's record of revision rev
// (rev 0: none): what ranking needs of it, and the whole record, decoded
// only when a writer or a read asks for it. Every worker's view sees
// every write of every host's record, and a worker writes only some of
// them: decoding each whole (a planned record's address plan and
// assignments are most of its bytes) was most of the view's cost.
type viewedHost struct {
	rev         uint64
	proxies     map[string]uint64 // the record's Proxies; shared, never changed
	quarantined bool
	rec         *lazyRecord
}

// lazyRecord is a host's record, decoded on first use; it is never
// changed after that, so every copy of a viewedHost shares it.
type lazyRecord struct {
	once sync.Once
	host string
	room messages.HostRoom   // until decoded
	rec  messages.HostRecord // once decoded
	err  error
}

// recordOf is a viewed record decoded already (this worker's own write).
func recordOf(rec messages.HostRecord) *lazyRecord {
	l := &lazyRecord{rec: rec}
	l.once.Do(func() {})
	return l
}

// record returns the decoded record: shared, read it, never change it.
// Its Proxies are the viewedHost's.
func (l *lazyRecord) record() (messages.HostRecord, error) {
	l.once.Do(func() {
		l.rec, l.err = l.room.Record(messages.HostRecord{V: messages.Version, Host: l.host, State: messages.HostOK})
		if l.err != nil {
			l.err = fmt.Errorf("host %s: %w", l.host, l.err)
		}
		l.room = messages.HostRoom{}
	})
	return l.rec, l.err
}

func newHostView(kv jetstream.KeyValue, nc *nats.Conn, retry time.Duration, log *slog.Logger) *hostView {
	return &hostView{kv: kv, nc: nc, retry: retry, log: log, recs: map[string]viewedHost{}, seed: maphash.MakeSeed()}
}

// setOrder makes hosts (the catalog's, which placement ranks) the order
// each walks without a lookup by name. It is called before run.
func (v *hostView) setOrder(hosts []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.order, v.pos, v.inOrder = hosts, make(map[string]int, len(hosts)), make([]viewedHost, len(hosts))
	for i, h := range hosts {
		v.pos[h] = i
		if r, ok := v.recs[h]; ok {
			v.inOrder[i] = r
		}
	}
}

// sameHosts reports whether a and b are the same slice (not merely equal).
func sameHosts(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// run keeps the view until ctx is done; a watch that ends is begun anew
// after retry.
func (v *hostView) run(ctx context.Context) {
	followAgain(ctx, "host view", v.retry, v.log, v.follow)
}

func (v *hostView) follow(ctx context.Context) error {
	v.mu.Lock()
	v.ready = false
	clear(v.recs)
	clear(v.inOrder)
	v.holders, v.holderN = nil, 0
	v.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kw, err := v.kv.WatchAll(wctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", messages.BucketHosts, err)
	}
	defer jsapi.StopWatcher(v.nc, kw)
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-kw.Updates():
			if !ok {
				return fmt.Errorf("watch %s: ended", messages.BucketHosts)
			}
			if e == nil { // every record delivered
				v.mu.Lock()
				v.ready = true
				v.mu.Unlock()
				continue
			}
			v.update(e.Key(), e.Revision(), e.Operation(), e.Value())
		}
	}
}

// update puts in what the watcher delivered of host: its record as
// stored at revision rev (value, for a put), or none (a delete or purge).
func (v *hostView) update(host string, rev uint64, op jetstream.KeyValueOp, value []byte) {
	if v.holds(host, rev) {
		return // this worker's own write, put in as it was stored
	}
	if op != jetstream.KeyValuePut {
		v.putViewed(host, viewedHost{rev: rev, rec: recordOf(messages.HostRecord{V: messages.Version, Host: host, State: messages.HostOK})})
		return
	}
	room, err := messages.DecodeHostRoom(value)
	if err != nil {
		v.log.Warn("host view: undecodable record", "host", host, "err", err)
		return
	}
	v.putViewed(host, viewedHost{rev: rev, proxies: room.Proxies, quarantined: room.Quarantined(),
		rec: &lazyRecord{host: host, room: room}})
}

// put records host's record as of revision rev, unless the view holds a
// later one.
func (v *hostView) put(host string, rec messages.HostRecord, rev uint64) {
	if v == nil {
		return
	}
	v.putViewed(host, viewedHost{rev: rev, proxies: rec.Proxies, quarantined: rec.Quarantined(), rec: recordOf(rec)})
}

// putViewed records h (of revision h.rev) as host's, unless the view
// holds a later one.
func (v *hostView) putViewed(host string, h viewedHost) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.recs[host]
	if ok && cur.rev >= h.rev {
		return
	}
	v.recs[host] = h
	if i, ok := v.pos[host]; ok {
		v.inOrder[i] = h
	}
	v.countHoldersLocked(cur.proxies, h.proxies)
}

// countHoldersLocked updates holders for a record whose proxies were old
// and are now new (recs holds the new one already).
func (v *hostView) countHoldersLocked(old, new map[string]uint64) {
	if v.holders == nil {
		v.holders = make([]uint8, minHolderSlots)
	}
	for id := range old {
		if _, ok := new[id]; ok {
			continue
		}
		v.holderN--
		if s := v.holderSlot(id); v.holders[s] > 0 && v.holders[s] < math.MaxUint8 {
			v.holders[s]-- // a full counter stays: it no longer knows its count
		}
	}
	for id := range new {
		if _, ok := old[id]; ok {
			continue
		}
		v.holderN++
		if s := v.holderSlot(id); v.holders[s] < math.MaxUint8 {
			v.holders[s]++
		}
	}
	if v.holderN*holderSlotsPerID > len(v.holders) {
		v.recountHoldersLocked()
	}
}

// minHolderSlots and holderSlotsPerID size holders: at least that many
// slots, eight an id (about one id in ten then finds its slot taken).
const (
	minHolderSlots   = 1 << 10
	holderSlotsPerID = 8
)

// recountHoldersLocked makes holders anew from recs, sized for the ids
// they hold.
func (v *hostView) recountHoldersLocked() {
	n := 0
	for _, r := range v.recs {
		n += len(r.proxies)
	}
	size := minHolderSlots
	for size < 2*n*holderSlotsPerID {
		size *= 2
	}
	v.holders, v.holderN = make([]uint8, size), n
	for _, r := range v.recs {
		for id := range r.proxies {
			if s := v.holderSlot(id); v.holders[s] < math.MaxUint8 {
				v.holders[s]++
			}
		}
	}
}

func (v *hostView) holderSlot(id string) int {
	return int(maphash.String(v.seed, id) & uint64(len(v.holders)-1))
}

// each calls fn, under one hold of the view's lock, with what the view
// holds of each of hosts (i its index) for a create of id: how many
// proxies hold room there, whether id is one, whether it is quarantined.
// It reports false, calling nothing, while the view has not caught up.
func (v *hostView) each(hosts []string, id string, fn func(i int, host string, n int, held, quarantined bool)) bool {
	if v == nil {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.ready {
		return false
	}
	anyHolds := len(v.holders) > 0 && v.holders[v.holderSlot(id)] > 0
	if sameHosts(hosts, v.order) {
		for i := range v.inOrder {
			r := &v.inOrder[i]
			held := false
			if anyHolds && r.rev != 0 {
				_, held = r.proxies[id]
			}
			fn(i, hosts[i], len(r.proxies), held, r.rev != 0 && r.quarantined)
		}
		return true
	}
	for i, h := range hosts {
		r, ok := v.recs[h]
		if !ok {
			fn(i, h, 0, false, false)
			continue
		}
		held := false
		if anyHolds {
			_, held = r.proxies[id]
		}
		fn(i, h, len(r.proxies), held, r.quarantined)
	}
	return true
}

// latest returns the newest record of host the view holds, with its
// revision, once the view has caught up (a guess for a compare-and-set,
// never a judgment: a view made anew after its bucket was, before it
// caught up, could guess a revision the new bucket has too). The record is
// shared: read it, never change it.
func (v *hostView) latest(host string) (messages.HostRecord, uint64, bool) {
	if v == nil {
		return messages.HostRecord{}, 0, false
	}
	v.mu.Lock()
	r, ok := v.recs[host]
	ready := v.ready
	v.mu.Unlock()
	if !ready || !ok || r.rev == 0 {
		return messages.HostRecord{}, 0, false
	}
	rec, err := r.rec.record()
	if err != nil {
		return messages.HostRecord{}, 0, false // the writer reads it, and finds it so
	}
	return rec, r.rev, true
}

// holds reports whether the view has host's record of revision rev or a
// later one.
func (v *hostView) holds(host string, rev uint64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.recs[host]
	return ok && r.rev >= rev
}

// at returns host's record of revision rev if the view holds that one (a
// record a KV revision names is always the same): a read of the record
// need not decode it again, nor keep a copy of its own. The record is
// shared: read it, never change it.
func (v *hostView) at(host string, rev uint64) (messages.HostRecord, bool) {
	if v == nil {
		return messages.HostRecord{}, false
	}
	v.mu.Lock()
	r, ok := v.recs[host]
	v.mu.Unlock()
	if !ok || r.rev != rev {
		return messages.HostRecord{}, false
	}
	rec, err := r.rec.record()
	return rec, err == nil
}

// errViewNotReady: the watcher has not delivered every record yet.
var errViewNotReady = errors.New("host view not caught up")

// record returns host's record as the view has it. The record is shared:
// read it, never change it.
func (v *hostView) record(host string) (messages.HostRecord, error) {
	if v == nil {
		return messages.HostRecord{}, errViewNotReady
	}
	v.mu.Lock()
	r, ok := v.recs[host]
	ready := v.ready
	v.mu.Unlock()
	if !ready {
		return messages.HostRecord{}, errViewNotReady
	}
	if ok {
		return r.rec.record()
	}
	return messages.HostRecord{V: messages.Version, Host: host, State: messages.HostOK}, nil
}

// followAgain runs follow until ctx is done: a follow that ends (its watch
// gone) is begun anew after retry. The host view keeps itself this way.
func followAgain(ctx context.Context, what string, retry time.Duration, log *slog.Logger, follow func(context.Context) error) {
	for {
		err := follow(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Warn(what+": made anew", "err", err)
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
