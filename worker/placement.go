package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"proxyfleet/messages"
)

// placeCreate decides the host of a create and reserves its room there
// (see room.go): the host it names; or, naming none, the host the proxy is
// placed on already; or the healthy host with the most free room (see
// placeByRoom). A host with no room rejects the create, naming the field
// host.
func (in *intake) placeCreate(ctx context.Context, rec, cur *messages.Desired) (*messages.FieldError, error) {
	w := in.w
	if rec.Host == "" && cur != nil && cur.Op == messages.OpCreate && w.catalog.hasHost(cur.Host) {
		rec.Host = cur.Host // it stays where it is: no new room
	}
	if rec.Host == "" {
		host, ferr, err := w.placeByRoom(ctx, rec.ID, rec.Seq)
		if ferr != nil || err != nil {
			return ferr, err
		}
		rec.Host = host
		return nil, nil
	}
	err := w.reserve(ctx, rec.Host, rec.ID, rec.Seq, false)
	if errors.Is(err, errFull) {
		return &messages.FieldError{Field: "host", Reason: err.Error()}, nil
	}
	return nil, err
}

// placeByRoom reserves room for id on the healthy (not quarantined) host
// with the most free room, and returns it. The hosts within a band of the
// most (placeBand) rank alike: of those, the ones this worker pulls come
// first, the fullest first, and the rendezvous hash of id and the host
// breaks the remaining ties (so every worker breaks them alike). A host
// that holds room for id already comes first: it needs none. With no
// healthy host left with room, the create is rejected, saying so.
//
// The hosts are ranked on the records as the host view has them (it only
// ranks: each reservation reads the record afresh), or as read now while
// it is not caught up. A host the view shows full or quarantined is not
// passed over on the view's word: if no host the view shows with room
// takes the create, those are read afresh and tried in turn, so a view
// behind the bucket (made anew, say) never turns a create away. Reading
// them only then keeps a create's cost from growing with the hosts that
// are full: reading each of them for every create cost a fleet that is
// filling up one read per full host per create (BenchmarkPlaceByRoomNearlyFull:
// 13.7ms a create with 450 of 500 hosts full).
func (w *Worker) placeByRoom(ctx context.Context, id string, seq uint64) (string, *messages.FieldError, error) {
	buf := candidateBufs.Get().(*[]candidate)
	defer candidateBufs.Put(buf)
	cands, recheck, notes, err := w.rankHosts(ctx, w.catalog.Hosts, id, false, (*buf)[:0])
	if cap(cands) > cap(*buf) {
		*buf = cands[:0]
	}
	if err != nil {
		return "", nil, err
	}
	host, notes, err := w.reserveFirst(ctx, cands, id, seq, notes)
	if host != "" || err != nil {
		return host, nil, err
	}
	if len(recheck) > 0 {
		cands, _, more, err := w.rankHosts(ctx, recheck, id, true, nil)
		if err != nil {
			return "", nil, err
		}
		if host, notes, err = w.reserveFirst(ctx, cands, id, seq, append(notes, more...)); host != "" || err != nil {
			return host, nil, err
		}
	}
	sort.Strings(notes)
	return "", &messages.FieldError{Field: "host", Reason: "no room on any healthy host: " + strings.Join(notes, ", ")}, nil
}

// candidateBufs holds the slices every create ranks the hosts into (24
// KiB with 500 hosts; made anew for each create they were an eighth of
// the bytes a busy worker allocated).
var candidateBufs = sync.Pool{New: func() any { return new([]candidate) }}

// candidate is a host a create may be placed on.
type candidate struct {
	host   string
	held   bool   // the id holds room there already
	owned  bool   // this worker pulls it (ownedHosts)
	free   int    // its free room; in the top band, the band's least (topBand)
	room   int    // its free room
	index  int    // its place in the hosts ranked
	score  uint64 // rendezvous(host, id), once a tie needed it
	scored bool
}

// placeBandDiv divides the smallest room of the catalog's hosts into the
// width of placement's top band (placeBand).
const placeBandDiv = 16

// placeBand is the width of placement's top band: a sixteenth of the
// smallest room of rooms (the catalog's hosts'), at least 1. The hosts
// within that of the most free room rank alike (topBand), and of those
// the hosts this worker pulls come first, the fullest first: their
// records are written by this worker's reservations and its executors'
// and seen at once by its view, and its reservations on one host go out
// together as one write (hostWriter), where a host the workers share
// takes the writes of all of them, each judged on a view that lags in a
// burst and refused when another's came first (docs/DECISIONS.md,
// "Placement prefers the worker's own hosts within a band of the most
// free room"). A host further behind comes after them all. With rooms
// under 32 there is no band: each free place counts, and the rendezvous
// hash alone breaks ties, spreading the creates placed at once over the
// hosts that tie (a hundred such creates on a worker's fullest host
// would fill it while others stay empty).
func placeBand(rooms []int) int {
	if len(rooms) == 0 {
		return 1
	}
	return max(1, slices.Min(rooms)/placeBandDiv)
}

// topBand makes the candidates within band of the most free room among
// cands rank alike (see placeBand): their free room counts as the least
// of the band. Others keep theirs.
func topBand(cands []candidate, band int) {
	if band <= 1 || len(cands) == 0 {
		return
	}
	top := cands[0].free
	for i := range cands {
		top = max(top, cands[i].free)
	}
	floor := top - band + 1
	for i := range cands {
		cands[i].free = min(cands[i].free, floor)
	}
}

// before says whether a goes before b: the host that holds room already,
// then the most free room (the top band's hosts alike), then one this
// worker pulls (of two, the fuller, then the first ranked), then the
// higher rendezvous score.
func (a *candidate) before(b *candidate, id string) bool {
	if a.held != b.held {
		return a.held
	}
	if a.free != b.free {
		return a.free > b.free
	}
	if a.owned != b.owned {
		return a.owned
	}
	if a.owned {
		if a.room != b.room {
			return a.room < b.room
		}
		return a.index < b.index
	}
	for _, c := range []*candidate{a, b} {
		if !c.scored {
			c.score, c.scored = rendezvous(c.host, id), true
		}
	}
	return a.score > b.score
}

// rankHosts returns the hosts among hosts with room for id (in no order:
// reserveFirst takes the best first), and notes saying why each other one
// has none. Each record is the host view's, unless fresh or the view has
// not caught up: then it is read from the server. A host the view shows
// full or quarantined is neither a candidate nor noted: it is returned in
// recheck, for a fresh read if no candidate takes the create.
//
// Every create ranks every host, so the view is read under one lock, and
// nothing is sorted: reserveFirst picks the best candidate, and the next
// only if that one refuses (BenchmarkRankHosts, 500 hosts: 145µs a create
// with a lock and a sort of them all, 28µs with a lookup by name of each
// host's record and room, 11µs walking them in the catalog's order, see
// rankInOrder).
func (w *Worker) rankHosts(ctx context.Context, hosts []string, id string, fresh bool, buf []candidate) (cands []candidate, recheck, notes []string, err error) {
	cands = buf[:0]
	if cap(cands) < len(hosts) {
		cands = make([]candidate, 0, len(hosts))
	}
	rooms := w.rooms // the catalog's, in its order
	var owned []bool
	if w.band > 1 {
		owned = w.ownedHosts()
	}
	if !sameHosts(hosts, w.catalog.Hosts) || len(rooms) != len(hosts) {
		rooms, owned = nil, nil
	}
	judge := func(i int, h string, n int, held, quarantined, viewed bool) {
		var room int
		if rooms != nil {
			room = rooms[i]
		} else {
			room = w.catalog.maxProxies(h)
		}
		switch {
		case viewed && (quarantined || !held && n >= room):
			recheck = append(recheck, h)
		case quarantined:
			notes = append(notes, h+" quarantined")
		case !held && n >= room:
			notes = append(notes, fmt.Sprintf("%s full (%d of %d)", h, n, room))
		default:
			cands = append(cands, candidate{host: h, held: held, owned: owned != nil && owned[i], free: room - n, room: room - n, index: i})
		}
	}
	if !fresh && w.hostView.each(hosts, id, func(i int, h string, n int, held, quarantined bool) { judge(i, h, n, held, quarantined, true) }) {
		topBand(cands, w.band)
		return cands, recheck, notes, nil
	}
	for i, h := range hosts {
		rec, _, err := w.readHost(ctx, h)
		if err != nil {
			return nil, nil, nil, err
		}
		_, held := rec.Proxies[id]
		judge(i, h, len(rec.Proxies), held, rec.Quarantined(), false)
	}
	topBand(cands, w.band)
	return cands, recheck, notes, nil
}

// ownedHosts says which of the catalog's hosts, in its order, the
// membership assigns this worker; nil while it assigns none (or there is
// no membership). Made anew only when the assignment changes.
func (w *Worker) ownedHosts() []bool {
	if w.members == nil {
		return nil
	}
	mine := w.members.Mine()
	if len(mine) == 0 {
		return nil
	}
	w.ownedMu.Lock()
	defer w.ownedMu.Unlock()
	if sameHosts(mine, w.ownedOf) {
		return w.owned
	}
	mineSet := make(map[string]bool, len(mine))
	for _, h := range mine {
		mineSet[h] = true
	}
	owned := make([]bool, len(w.catalog.Hosts))
	for i, h := range w.catalog.Hosts {
		owned[i] = mineSet[h]
	}
	w.ownedOf, w.owned = mine, owned
	return owned
}

// rankInOrder has placement walk the catalog's hosts in its order: the
// host view's records and the hosts' rooms are kept in that order, not
// looked up by name for every host of every create. Called before the
// view runs.
func (w *Worker) rankInOrder() {
	w.hostView.setOrder(w.catalog.Hosts)
	w.rooms = make([]int, len(w.catalog.Hosts))
	for i, h := range w.catalog.Hosts {
		w.rooms[i] = w.catalog.maxProxies(h)
	}
	w.band = placeBand(w.rooms)
}

// bestOf is the index of the best of cands (not empty) for id.
func bestOf(cands []candidate, id string) int {
	best := 0
	for i := 1; i < len(cands); i++ {
		if cands[i].before(&cands[best], id) {
			best = i
		}
	}
	return best
}

// reserveFirst reserves room for id on the best of cands that has it when
// its record is read afresh, trying them best first, and returns that
// host; "" and the notes with why each one refused, when none did.
func (w *Worker) reserveFirst(ctx context.Context, cands []candidate, id string, seq uint64, notes []string) (string, []string, error) {
	for len(cands) > 0 {
		best := bestOf(cands, id)
		c := cands[best]
		cands[best] = cands[len(cands)-1]
		cands = cands[:len(cands)-1]
		err := w.reservePlaced(ctx, c.host, id, seq)
		if err == nil {
			return c.host, notes, nil
		}
		var full *fullError
		switch {
		case errors.Is(err, errQuarantined):
			// Quarantined since the view or the read said otherwise.
			notes = append(notes, c.host+" quarantined")
		case errors.As(err, &full):
			// Taken by another intake since it was read.
			notes = append(notes, full.note())
		default:
			return "", notes, err
		}
	}
	return "", notes, nil
}

// errQuarantined: placement found the host quarantined on its fresh read.
var errQuarantined = errors.New("host quarantined")

// reservePlaced is reserve for a host placement chose from what it read
// before: judged on the record as it is now, a host quarantined meanwhile
// is refused (errQuarantined) as a full one is.
func (w *Worker) reservePlaced(ctx context.Context, host, id string, seq uint64) error {
	return w.updateHost(ctx, host, func(rec *messages.HostRecord) error {
		if rec.Quarantined() {
			return errQuarantined
		}
		_, err := reserveEdit(rec, host, id, seq, w.catalog.maxProxies(host), false, w.catalog.Plans[host], time.Now())
		return err
	})
}
