package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// hostNames are n hosts' names, h1 to hn.
func hostNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d", i+1)
	}
	return out
}

// placementRig is a worker's placement over hosts on an embedded server:
// the first full of them hold 5 proxies of their 5, the others have room
// for a billion; its host view has caught up.
func placementRig(tb testing.TB, hosts, full int) *Worker {
	tb.Helper()
	srv := natstest.Start(tb)
	_, js := srv.Connect(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketHosts})
	if err != nil {
		tb.Fatal(err)
	}
	names := hostNames(hosts)
	room := map[string]int{}
	for i, h := range names {
		room[h] = 1 << 30
		if i < full {
			room[h] = 5
			rec := messages.HostRecord{V: messages.Version, Host: h, MaxProxies: 5, State: messages.HostOK, Proxies: map[string]uint64{}}
			for p := range 5 {
				rec.Proxies[fmt.Sprintf("%s-p%d", h, p)] = 1
			}
			b, _ := json.Marshal(rec)
			if _, err := kv.Put(ctx, h, b); err != nil {
				tb.Fatal(err)
			}
		}
	}
	log := slog.New(slog.DiscardHandler)
	w := &Worker{metrics: newMetrics(), js: js, hosts: kv, log: log, catalog: Catalog{Hosts: names, MaxProxies: room}}
	w.startWriters()
	tb.Cleanup(w.stopWriters)
	w.hostView = newHostView(kv, js.Conn(), time.Second, log)
	w.rankInOrder()
	viewCtx, stopView := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.hostView.run(viewCtx)
	}()
	tb.Cleanup(func() { stopView(); <-done })
	poll.Until(tb, "the host view to catch up", 30*time.Second, func() bool {
		_, err := w.hostView.record(names[0])
		return err == nil
	})
	return w
}

// BenchmarkPlaceByRoomNearlyFull: a create placed on a fleet whose hosts
// are nearly all full (450 of 500), as every create of a burst that fills
// the fleet meets towards its end.
func BenchmarkPlaceByRoomNearlyFull(b *testing.B) {
	w := placementRig(b, 500, 450)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		host, ferr, err := w.placeByRoom(ctx, fmt.Sprintf("p%d", i), uint64(i))
		if err != nil || ferr != nil || host == "" {
			b.Fatalf("placed on %q: %v %v", host, ferr, err)
		}
	}
}

// A create placed on a fleet that is nearly full lands on a host with
// room, never on one the view shows full; with every host full, it is
// turned away naming them. The records it reads are a budget
// (BenchmarkPlacementRecordReads, bench section budgets).
func TestPlacementSkipsFullHosts(t *testing.T) {
	w := placementRig(t, 50, 45)
	ctx := context.Background()
	fullHosts := hostNames(45)
	for i := range 10 {
		host, ferr, err := w.placeByRoom(ctx, fmt.Sprintf("p%d", i), uint64(i+1))
		if err != nil || ferr != nil || host == "" || slices.Contains(fullHosts, host) {
			t.Fatalf("p%d placed on %q: %v %v", i, host, ferr, err)
		}
	}

	full := placementRig(t, 5, 5)
	_, ferr, err := full.placeByRoom(ctx, "q", 1)
	if err != nil || ferr == nil || ferr.Field != "host" || !strings.Contains(ferr.Reason, "h5 full (5 of 5)") {
		t.Fatalf("a create with every host full: %v, %v; want rejected, field host, each host named full", ferr, err)
	}
}

// BenchmarkRankHosts: what ranking the hosts and choosing the best costs
// every create a worker places, with 500 hosts of room in its view (the
// reservation aside).
//
// Each host holds 100 proxies in the view, as at 50,000 over 500 hosts: a
// lookup of the id in every host's record (whether it holds room there
// already) was most of the cost (fleet50k profile: 560 of 870ms), a cache
// miss each.
func BenchmarkRankHosts(b *testing.B) {
	w := placementRig(b, 500, 0)
	for i, h := range w.catalog.Hosts {
		rec := messages.HostRecord{V: messages.Version, Host: h, State: messages.HostOK, Proxies: map[string]uint64{}}
		for p := range 100 {
			rec.Proxies[fmt.Sprintf("%s-p%d", h, p)] = 1
		}
		w.hostView.put(h, rec, uint64(1000+i))
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	var buf []candidate
	for b.Loop() {
		i++
		id := fmt.Sprintf("p%d", i)
		cands, _, _, err := w.rankHosts(ctx, w.catalog.Hosts, id, false, buf)
		if err != nil || len(cands) != 500 {
			b.Fatalf("%d candidates, %v", len(cands), err)
		}
		_ = bestOf(cands, id)
		buf = cands[:0]
	}
}

// The view says which hosts hold room for an id already, through records
// replaced, emptied and dropped, as a lookup in each record would; and
// walking the catalog's hosts in its order (rankInOrder) sees what
// looking each one up by name sees.
func TestHostViewHeldFollowsRecords(t *testing.T) {
	v := newHostView(nil, nil, time.Second, slog.New(slog.DiscardHandler))
	v.ready = true
	order := []string{"h1", "h2", "h3"}
	v.setOrder(order)
	walk := func(hosts []string, id string) (on, seen []string) {
		v.each(hosts, id, func(i int, h string, n int, held, quarantined bool) {
			if hosts[i] != h {
				t.Errorf("host %d is %s, want %s", i, h, hosts[i])
			}
			seen = append(seen, fmt.Sprintf("%s: %d proxies, held %v, quarantined %v", h, n, held, quarantined))
			if held {
				on = append(on, h)
			}
		})
		return on, seen
	}
	rec := func(h string, ids ...string) messages.HostRecord {
		r := messages.HostRecord{V: messages.Version, Host: h, State: messages.HostOK, Proxies: map[string]uint64{}}
		for _, id := range ids {
			r.Proxies[id] = 1
		}
		return r
	}
	heldOn := func(id string) []string {
		on, inOrder := walk(order, id)
		_, byName := walk(slices.Clone(order), id)
		if !slices.Equal(inOrder, byName) {
			t.Errorf("for %s, in the catalog's order: %v; by name: %v", id, inOrder, byName)
		}
		return on
	}
	steps := []struct {
		host string
		rev  uint64
		rec  messages.HostRecord
		id   string
		want []string
	}{
		{"h1", 1, rec("h1", "a", "b"), "a", []string{"h1"}},
		{"h2", 1, rec("h2", "a"), "a", []string{"h1", "h2"}},
		{"h1", 2, rec("h1", "b"), "a", []string{"h2"}},
		{"h1", 1, rec("h1", "a"), "a", []string{"h2"}}, // an older revision changes nothing
		{"h2", 2, rec("h2"), "a", nil},
		{"h3", 1, rec("h3", "c"), "b", []string{"h1"}},
		{"h1", 3, rec("h1", "c"), "c", []string{"h1", "h3"}},
	}
	for i, s := range steps {
		v.put(s.host, s.rec, s.rev)
		if got := heldOn(s.id); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: %s held on %v, want %v", i, s.id, got, s.want)
		}
	}
	// h1 and h3 hold c, nothing else is held: two counted, whatever
	// slots they share.
	sum := 0
	for _, n := range v.holders {
		sum += int(n)
	}
	if sum != 2 || v.holderN != 2 {
		t.Errorf("holders counts %d (%d ids), want 2: c on h1 and h3", sum, v.holderN)
	}
	// Past eight slots an id, the filter is made anew, larger, and still
	// counts what the records hold.
	big := rec("h2")
	for i := range 2000 {
		big.Proxies[fmt.Sprintf("x%d", i)] = 1
	}
	v.put("h2", big, 9)
	if len(v.holders) < 8*2000 {
		t.Fatalf("%d slots for 2000 ids", len(v.holders))
	}
	for _, id := range []string{"x0", "x1999", "c"} {
		if v.holders[v.holderSlot(id)] == 0 {
			t.Errorf("%s is held, but its slot counts nothing", id)
		}
	}
	if got := heldOn("x7"); !slices.Equal(got, []string{"h2"}) {
		t.Errorf("x7 held on %v, want [h2]", got)
	}
	q := rec("h3", "c")
	q.State = messages.HostQuarantined
	v.put("h3", q, 2)
	if _, seen := walk(order, "c"); seen[2] != "h3: 1 proxies, held true, quarantined true" {
		t.Errorf("h3 quarantined: %s", seen[2])
	}
	heldOn("c")
}

// BenchmarkReserveEditPlanned is a create's reservation on a host with a
// plan holding a hundred proxies: the record's assignments read for the
// new proxy's slots and written with them.
func BenchmarkReserveEditPlanned(b *testing.B) {
	plan, err := addrplan.New("h1", addrplan.Config{IPv4: []string{"198.18.0.0/24"}, IPv6: []string{"2001:db8:1::/64"}, IPv6PerProxy: 16})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	base := messages.HostRecord{Host: "h1", Proxies: map[string]uint64{}}
	var st messages.AddrState
	for i := range 100 {
		id := fmt.Sprintf("f%05d", i*500)
		base.Proxies[id] = 1
		if _, err := plan.Assign(&st, id, now); err != nil {
			b.Fatal(err)
		}
	}
	base.Addresses = messages.EncodeAddrs(st)
	b.ReportAllocs()
	for b.Loop() {
		rec := base
		rec.Proxies = map[string]uint64{} // the other proxies' room does not count here
		if _, err := reserveEdit(&rec, "h1", "f25001", 2, 200, false, plan, now); err != nil {
			b.Fatal(err)
		}
	}
}

// assigned is a membership that assigns the worker hosts (sharing's
// Mine); placement asks nothing else of it.
type assigned struct {
	sharing
	hosts []string
}

func (a assigned) Mine() []string { return a.hosts }

// Placement takes the most free room, but the hosts within a band of the
// most rank alike (a sixteenth of the smallest room): of those, the
// worker's own come first, the fullest first, so that its reservations
// on one host go out together; without one of its own there, the
// rendezvous hash spreads the creates. A host a band or more behind is
// never taken while they have room. With small rooms each free place
// counts, the worker's own hosts are not preferred, and the rendezvous
// hash spreads the creates over the hosts that tie.
func TestPlacementPrefersOwnHostsWithinTheTopBand(t *testing.T) {
	// pick ranks hosts with the given proxies of room each (from the
	// view, as in a burst), this worker assigned mine, and returns where
	// each of n creates would go.
	pick := func(room int, proxies []int, mine []string, n int) map[string]int {
		t.Helper()
		v := newHostView(nil, nil, time.Second, slog.New(slog.DiscardHandler))
		v.ready = true
		names := hostNames(len(proxies))
		rooms := map[string]int{}
		w := &Worker{metrics: newMetrics(), log: slog.New(slog.DiscardHandler), hostView: v,
			catalog: Catalog{Hosts: names, MaxProxies: rooms}}
		if mine != nil {
			w.members = assigned{hosts: mine}
		}
		for i, h := range names {
			rooms[h] = room
			rec := messages.HostRecord{V: messages.Version, Host: h, State: messages.HostOK, Proxies: map[string]uint64{}}
			for p := range proxies[i] {
				rec.Proxies[fmt.Sprintf("%s-p%d", h, p)] = 1
			}
			v.put(h, rec, uint64(i+1))
		}
		w.rankInOrder()
		got := map[string]int{}
		for i := range n {
			id := fmt.Sprintf("p%d", i)
			cands, _, _, err := w.rankHosts(context.Background(), names, id, false, nil)
			if err != nil || len(cands) == 0 {
				t.Fatalf("rank for %s: %d candidates, %v", id, len(cands), err)
			}
			got[cands[bestOf(cands, id)].host]++
		}
		return got
	}
	// Room 160: a band of 10. h1 has 160 free, h2 152, h3 151 (both in the
	// band), h4 150 (behind it by 10).
	proxies := []int{0, 8, 9, 10}
	if got := pick(160, proxies, []string{"h3", "h4"}, 200); got["h3"] != 200 {
		t.Errorf("own hosts h3, h4: creates went to %v; want all on h3, the own host in the top band", got)
	}
	if got := pick(160, proxies, []string{"h1", "h2"}, 200); got["h2"] != 200 {
		t.Errorf("own hosts h1, h2: creates went to %v; want all on h2, the fuller own host in the top band", got)
	}
	got := pick(160, proxies, nil, 300)
	if got["h4"] != 0 || got["h1"] == 0 || got["h2"] == 0 || got["h3"] == 0 {
		t.Errorf("no own hosts: creates went to %v; want them spread over h1, h2 and h3, none on h4", got)
	}
	if got := pick(160, proxies, []string{"h4"}, 100); got["h4"] != 0 {
		t.Errorf("own host h4 a band behind: creates went to %v; want none on h4", got)
	}
	// Room 20: a band of 1, the most free room decides, and the hash
	// breaks ties, whatever the worker's own hosts.
	if got := pick(20, []int{0, 1, 0}, []string{"h2"}, 50); got["h2"] != 0 || got["h1"] == 0 || got["h3"] == 0 {
		t.Errorf("room 20, own host h2 with one proxy more: creates went to %v; want them spread over h1 and h3", got)
	}
	if got := pick(20, []int{0, 1, 0}, []string{"h3"}, 50); got["h2"] != 0 || got["h1"] == 0 || got["h3"] == 0 {
		t.Errorf("room 20, own host h3 tied for the most free room: creates went to %v; want them spread over h1 and h3", got)
	}
}

// The rendezvous hash ranks the hosts differently for each id: over 500
// hosts named alike, 50,000 ids each pick every host first about as
// often (100 each on average; a binomial spread stays well within 50 to
// 150). Placement breaks ties among the hosts with the most free room by
// it, so a hash that favoured some hosts would pile a burst on them.
func TestRendezvousSpreadsIDs(t *testing.T) {
	hosts := make([]string, 500)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%03d", i+1)
	}
	first := map[string]int{}
	for i := range 50000 {
		first[pickHost(fmt.Sprintf("f%05d", i), hosts)]++
	}
	for _, h := range hosts {
		if n := first[h]; n < 50 || n > 150 {
			t.Errorf("%s first for %d of 50000 ids; want 50 to 150 (100 on average)", h, n)
		}
	}
}
