package health

import (
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	"proxyfleet/messages"
)

// Fold is the rotation as a function of the state events and probe results
// seen so far: the rules of who is in the rotation live here, and the rest
// of the package moves events and results in and entries out. It does no
// I/O, starts no goroutine and reads the time only through Now (and the
// times given to it), so every rule is a test over plain values. Every
// health process that reads the same events computes nearly the same
// rotation (probes taken from elsewhere may differ), which is what lets a
// standby take over publishing without a hand-over. It is not safe for
// concurrent use; its owner serialises calls.
//
// Rules, per proxy id:
//   - an event whose seq is lower than or equal to the last one seen for
//     that id is ignored (duplicates, redeliveries, late arrivals);
//   - running with an IP and a port makes the proxy a candidate at
//     ip:port: it is probed there. With Rise 0 (no probing) it enters the
//     rotation at once; otherwise it enters after Rise passing probes in a
//     row and leaves after Fall failing ones in a row (and keeps being
//     probed, so it comes back after Rise passes). Since is when it
//     entered. A running event with another address (or host) is a new
//     proxy for clients: it leaves, its counters restart, and probes of the
//     old address still in flight are ignored;
//   - failed, deleting and deleted take it out at once and forget its
//     address and counters; its seq stays as a tombstone so that an older
//     event arriving late cannot bring it back, and a probe result for it
//     arriving later is ignored;
//   - provisioning (or running without an address) for a proxy in the
//     rotation, from the same command and host as the event before it,
//     starts its grace (a guest agent restart): it keeps its last address
//     and place, and keeps being probed there (Fall failures still take it
//     out), until Grace has passed since that event; then Tick demotes it.
//     With Grace 0 it is demoted at once. From another command or another
//     host (a re-create, a spec change, a move) it leaves at once: its old
//     address is not coming back. A running event with an address from
//     another command at the same address and host (a retried create that
//     found it running) keeps its place and makes that command the one
//     whose provisioning is on grace. A candidate not in the rotation
//     stops being probed and forgets its counters;
//   - an event with an unknown state, a wrong version or no id is ignored;
//   - a candidate whose running event came from the sim driver (source
//     sim) enters on its event, as with Rise 0, and is never probed: its
//     address is made up, and it carries no traffic.
//
// Probe results (ApplyProbe) name the candidate they were taken for by its
// epoch (see Targets), so a result for an address the proxy no longer has,
// or for a proxy deleted since, changes nothing, and one proxy's timeouts
// only ever count against that proxy; a result older than the last one
// applied for the same epoch is ignored too. Rising names the candidates
// the scheduler probes at once rather than in rounds: running, not yet in
// the rotation, no failure since its last pass, not refused.
//
// Verdicts. A passing probe may bring findings (see HTTPProber and
// Findings), and a candidate carries a verdict: ok, open, leaky or
// mismatch.
//   - Open: with CheckOpen (the proxies require credentials and the prober
//     can send a request without them), a candidate enters only once the
//     last open check of it (the same request without credentials) was
//     conclusive and refused: Rise passes in a row, the last with such a
//     check. One whose request without credentials reached the target is
//     open ("open proxy: answered a request without credentials"). Targets
//     says which probes must check: every candidate not in the rotation,
//     and one in it whose last conclusive check is OpenInterval old (or
//     whose last one was inconclusive).
//   - Leaky: the target saw the client's address, or the fleet's
//     credentials, in a header.
//   - Mismatch: the proxy's running event carries egress addresses (its
//     host's plan) and its request reached the target from an address not
//     among them, or (of the named address's family) from another than the
//     one it named ("egress mismatch: a request naming A left from B").
//
// Egress addresses. With EgressFamilies (the families with a probe
// target), each probe of a proxy with egress addresses names one of them
// (Target.Egress, sent as messages.HeaderEgress): the next of its
// addresses of those families each probe applied, from where its cycle
// starts (EgressStart), so over n probes in a row each of its n addresses
// is named once (egressChoice, a pure function of the list, the start and
// the count). A mismatched address is named again, probe after probe,
// until one leaves from it: that clears the verdict, and the cycle goes
// on. So is the address of a failing probe, until a probe through it
// passes: an address that never answers fails Fall probes in a row and
// takes the proxy out, rather than one probe in n between passes.
// Addresses of a family without a target are never named: only the address
// the proxy leaves from by default is checked against its plan.
//
// A refused proxy never enters, and one in the rotation leaves at once. It
// keeps being probed at the rounds' cadence (never at once, as a rising one
// is), and a later conclusive clean finding clears its verdict (a refusing
// open check for an open one, a report without the header for a leaky
// one), so nothing transient removes a healthy proxy for good. An
// inconclusive check (a timeout, no connection, a CONNECT granted without
// credentials whose tunnel then fails) changes nothing: it admits nothing
// and takes nobody out. The egress address the target saw is kept and shown
// in the entry; a change of it is a change of the entry, not of the
// proxy's address.
//
// Starting from what is published. Seed puts a proxy in the rotation as
// already risen: the membership a restarting process loads from
// PROXY_ROTATION, so a restart never empties the rotation while the process
// probes again. Events then apply as usual: a running event at the same
// address confirms a seeded proxy; another address, or failed, deleting,
// deleted, takes it out; provisioning starts its grace. DropUnseen, called
// once the events are caught up, removes the seeded proxies no event spoke
// of (their deleted event aged out). Adopt, on a takeover, puts in the
// rotation a proxy of PROXY_ROTATION that the fold has as running at the
// same address but not yet risen, so a takeover removes no passing proxy;
// Fall failures take out any that do not pass.
//
// This comment is the one statement of these rules; the package doc and
// docs/ARCHITECTURE.md point here. Where each is applied: events in
// fold.go, grace in fold_grace.go, probe results in fold_probe.go,
// verdicts and check records in fold_verdict.go, what to probe and which
// address to name in fold_targets.go, seeding and adoption in
// fold_seed.go, and what the publisher must look at again in
// fold_changes.go.
type Fold struct {
	// Grace is how long a proxy in the rotation keeps its place after it
	// reports provisioning without an address (a guest agent restart) from
	// the same command and host. Zero demotes it at once.
	Grace time.Duration
	// Rise is how many passing probes in a row put a candidate in the
	// rotation. Zero means no probing: a running event enters at once.
	Rise int
	// Fall is how many failing probes in a row take a proxy out. Zero:
	// failures never do.
	Fall int
	// Now is the fold's clock, used to bound event times from the future,
	// to start a grace whose event carries no time and to tell when an
	// open check is due. Nil means time.Now.
	Now func() time.Time
	// CheckOpen: the proxies require credentials, and the prober can send
	// a request without them. A candidate enters only after a conclusive
	// open check found it refusing; one found answering is refused.
	CheckOpen bool
	// OpenInterval is how old the last conclusive open check of a proxy
	// in the rotation may be before its next probe checks again. Zero:
	// every probe checks.
	OpenInterval time.Duration
	// Admitted, if set, is told how long each proxy waited from its
	// running event to its admission (latency.go).
	Admitted func(wait time.Duration)
	// EgressFamilies are the families of egress addresses a probe can
	// name (Target.Egress): those with a probe target of their family.
	// Zero: probes name no address, and only the address a proxy leaves
	// from by default is checked against its plan.
	EgressFamilies Families
	// EgressStart, if set, is where the cycle of id's probes through its
	// egress addresses starts (taken modulo their number). Nil: a hash
	// of id, so that proxies do not all start at their first address.
	EgressStart func(id string) uint64

	proxies map[string]*proxyState
	// dirty holds the ids whose rotation entry may have changed since
	// TakeDirty last emptied it: the publisher looks at those alone.
	dirty map[string]struct{}
	// onGrace holds the proxies in the rotation whose grace runs, so
	// that Tick and NextDeadline look at those alone.
	onGrace   map[*proxyState]struct{}
	epochs    uint64
	stats     FoldStats
	inRot     int    // proxies in the rotation
	checksGen uint64 // grows whenever a candidate's check record changes, appears or goes
	// checksDirty holds the ids whose check record may have changed,
	// appeared or gone since TakeChecksDirty last emptied it.
	checksDirty map[string]struct{}
	// hosts are the host names events named, each kept once for every
	// proxy of its host (internHost); at most maxInternedHosts.
	hosts map[string]string
}

// maxInternedHosts bounds Fold.hosts: past it, a host's name is kept as
// its event gave it (one copy a proxy, as without interning).
const maxInternedHosts = 1 << 14

// internHost returns host, shared with every proxy of that host: a
// decoded event's strings are its own, and the fold keeps one for every
// proxy of the fleet.
func (f *Fold) internHost(host string) string {
	if s, ok := f.hosts[host]; ok {
		return s
	}
	if len(f.hosts) >= maxInternedHosts {
		return host
	}
	if f.hosts == nil {
		f.hosts = map[string]string{}
	}
	f.hosts[host] = host
	return host
}

// internState returns state as its messages constant where it is one.
func internState(state string) string {
	switch state {
	case messages.StateProvisioning:
		return messages.StateProvisioning
	case messages.StateRunning:
		return messages.StateRunning
	case messages.StateFailed:
		return messages.StateFailed
	case messages.StateDeleting:
		return messages.StateDeleting
	case messages.StateDeleted:
		return messages.StateDeleted
	}
	return state
}

// FoldStats counts what the fold did.
type FoldStats struct {
	Events  uint64 // events given to Apply
	Ignored uint64 // events that were stale, duplicate or not understood
	Changes uint64 // calls of Apply, ApplyProbe, Tick, Adopt or DropUnseen that changed the rotation

	Probes        uint64 // probe results given to ApplyProbe
	ProbesIgnored uint64 // of which stale: another epoch, deleted, older
	Entries       uint64 // proxies that entered the rotation
	Exits         uint64 // proxies that left it, for any reason

	RefusedOpen  uint64 // times a candidate's verdict became open
	RefusedLeaky uint64 // times a candidate's verdict became leaky
	// RefusedMismatch: times a candidate's verdict became mismatch.
	RefusedMismatch uint64
	// EgressMismatches: passing probes whose target saw the request come
	// from another address than the one it named, or from one not of the
	// proxy's plan.
	EgressMismatches uint64
}

// proxyState is what the fold keeps of one proxy: its last seen event, its
// probing and its place in the rotation.
type proxyState struct {
	// The fields are ordered so that the struct packs without padding:
	// the fold holds one for every proxy of the fleet.
	id    string
	seq   uint64
	state string    // one of the messages.State constants, shared (internState)
	host  string    // shared with every proxy of the host (Fold.internHost)
	cmd   string    // command id of the last event
	ip    string    // last address reported, kept through a grace
	at    time.Time // time of the last event
	// runningAt is the time of the running event that made addr a
	// candidate, until its admission is told (latency.go).
	runningAt time.Time
	// labels of the proxy's create command, from its last event (never
	// changed in place: an event with other labels replaces the map)
	labels map[string]string
	// egressAddrs are the addresses its plan gave it, from its last
	// running event (never changed in place).
	egressAddrs []string

	addr      string // the candidate address: probed, and used in the rotation; "" when not a candidate
	epoch     uint64 // changes whenever addr does
	passes    int    // passing probes in a row at addr
	fails     int    // failing probes in a row at addr
	lastProbe time.Time

	since      time.Time // when it entered the rotation
	graceUntil time.Time // non-zero while it keeps its place in grace

	// What the probes of addr found (reset with it).
	egress string // the address the target saw, "" if never reported
	// bad holds what keeps it out of the rotation (leak, mismatch); nil
	// while the probes found neither, as for nearly every proxy.
	bad *badFindings
	// egressTurn counts the probes applied that named an address: with
	// EgressStart, which address the next one names.
	egressTurn uint64
	openState  string    // last conclusive open check: OpenRefused, OpenAnswered, or "" for none
	openAt     time.Time // when that check was taken
	checkAt    time.Time // when its check record last changed

	sim         bool // the last running event with an address came from the sim driver
	seeded      bool // loaded by Seed and not yet confirmed by an event
	inRotation  bool
	reported    bool // a target reported a request of a probe
	openPending bool // the last open check was inconclusive
}

// badFindings are the probes' findings that keep a proxy out of the
// rotation, each "" for none.
type badFindings struct {
	leak     string // why it is leaky; "" if the last report found nothing
	mismatch string // the address a request left from, when not the one named or not one of egressAddrs; "" if none
	// mismatchNamed is the address the request found mismatched named
	// ("" for none): probes keep naming it until one leaves from it.
	mismatchNamed string
}

func (p *proxyState) leak() string {
	if p.bad == nil {
		return ""
	}
	return p.bad.leak
}

func (p *proxyState) mismatch() string {
	if p.bad == nil {
		return ""
	}
	return p.bad.mismatch
}

func (p *proxyState) mismatchNamed() string {
	if p.bad == nil {
		return ""
	}
	return p.bad.mismatchNamed
}

// setLeak sets the leak finding, keeping the mismatch.
func (p *proxyState) setLeak(leak string) {
	p.setBad(badFindings{leak: leak, mismatch: p.mismatch(), mismatchNamed: p.mismatchNamed()})
}

// setMismatch sets the mismatch finding, keeping the leak.
func (p *proxyState) setMismatch(addr, named string) {
	p.setBad(badFindings{leak: p.leak(), mismatch: addr, mismatchNamed: named})
}

func (p *proxyState) setBad(b badFindings) {
	if b == (badFindings{}) {
		p.bad = nil
		return
	}
	p.bad = &b
}

// NewFold returns an empty fold with the given grace and clock (nil:
// time.Now), without probing (Rise 0). Set Rise and Fall to probe.
func NewFold(grace time.Duration, now func() time.Time) *Fold {
	return &Fold{Grace: grace, Now: now}
}

func (f *Fold) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

// eventTime is the time an event happened: its own time, but never later
// than the fold's clock (a worker clock running ahead must not lengthen a
// grace or date an entry in the future).
func (f *Fold) eventTime(ev messages.StateEvent) time.Time {
	now := f.now()
	if ev.At.IsZero() || ev.At.After(now) {
		return now.UTC()
	}
	return ev.At.UTC()
}

// Addr is the rotation address of ip and port ("ip:port", "[v6]:port").
func Addr(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// Stats returns the fold's counters.
func (f *Fold) Stats() FoldStats { return f.stats }

// Seq returns the last seq seen for id (0 if none), tombstones included.
func (f *Fold) Seq(id string) uint64 {
	if p := f.proxies[id]; p != nil {
		return p.seq
	}
	return 0
}

func (f *Fold) get(id string) *proxyState {
	if f.proxies == nil {
		f.proxies = make(map[string]*proxyState)
	}
	p := f.proxies[id]
	if p == nil {
		p = &proxyState{id: id}
		f.proxies[id] = p
	}
	return p
}

// Apply folds one event in and reports whether the rotation changed.
func (f *Fold) Apply(ev messages.StateEvent) (changed bool) {
	f.stats.Events++
	changed, ok := f.apply(ev)
	if !ok {
		f.stats.Ignored++
	}
	if p := f.proxies[ev.ID]; ok && p != nil && p.inRotation {
		// Its host, labels or since may have changed without a
		// change of membership: the publisher compares.
		f.touch(p)
	}
	if changed {
		f.stats.Changes++
	}
	return changed
}

func (f *Fold) apply(ev messages.StateEvent) (changed, ok bool) {
	if ev.V != messages.Version || ev.ID == "" {
		return false, false
	}
	switch ev.State {
	case messages.StateProvisioning, messages.StateRunning, messages.StateFailed,
		messages.StateDeleting, messages.StateDeleted:
	default:
		return false, false
	}
	p := f.proxies[ev.ID]
	if p != nil && ev.Seq <= p.seq && !(p.seeded && p.seq == 0) {
		return false, false
	}
	p = f.get(ev.ID)
	at := f.eventTime(ev)
	// Another host, or another command, reporting the proxy: it is being
	// moved, re-created or changed. A seeded proxy knows neither yet.
	moved := p.host != ev.Host && !p.seeded
	newCommand := p.cmd != ev.CommandID && !p.seeded
	seeded := p.seeded
	p.seeded = false
	p.seq, p.state, p.host, p.cmd, p.at = ev.Seq, internState(ev.State), f.internHost(ev.Host), ev.CommandID, at
	// A proxy in the rotation whose labels or egress addresses change (a
	// spec change that kept its address) changes the snapshot, which
	// carries them: restated.
	restated := !maps.Equal(p.labels, ev.Labels)
	p.labels = ev.Labels

	switch {
	case ev.State == messages.StateRunning && ev.IP != "" && ev.Port > 0:
		p.ip = ev.IP
		if !slices.Equal(p.egressAddrs, ev.Egress) {
			p.egressAddrs = ev.Egress
			restated = true // the snapshot carries them too
		}
		addr := Addr(ev.IP, ev.Port)
		f.setGrace(p, time.Time{})
		if p.addr != addr || moved {
			// A new address (or host) is a new proxy for clients:
			// out, and probed from scratch.
			changed = f.leave(p)
			f.candidate(p, addr)
			p.runningAt = at
		} else if seeded && p.inRotation && at.Before(p.since) {
			// Confirmed: date it by the event, as a process that
			// saw the event live would.
			p.since = at
		}
		if restated && p.inRotation {
			changed = true
		}
		// The sim driver's proxies have made-up addresses: nothing to
		// probe, so they enter on the event, as without probing.
		p.sim = ev.Source == messages.SourceSim
		if !p.inRotation && (f.Rise <= 0 || p.sim || (p.passes >= f.Rise && f.admissible(p))) {
			f.enter(p, at)
			f.admitted(p)
			changed = true
		}
		return changed, true

	case ev.State == messages.StateRunning || ev.State == messages.StateProvisioning:
		// Not usable now, but maybe only for a moment (a guest agent
		// restart reports provisioning with no IP). Keep the last
		// address while in grace, if the same command and host that
		// put the proxy in the rotation still report it: from another,
		// the proxy is being moved, re-created or changed, and its old
		// address is not coming back.
		if ev.IP != "" {
			p.ip = ev.IP
		}
		if !p.inRotation {
			f.forget(p)
			return false, true
		}
		if moved || newCommand {
			f.leave(p)
			f.forget(p)
			return true, true
		}
		if p.graceUntil.IsZero() {
			f.setGrace(p, at.Add(f.Grace))
		}
		if !f.now().Before(p.graceUntil) {
			f.leave(p)
			f.forget(p)
			return true, true
		}
		return restated, true

	default: // failed, deleting, deleted: out, and forget all but the seq.
		changed = f.leave(p)
		f.forget(p)
		p.ip = ""
		return changed, true
	}
}

// candidate starts probing p at addr, from scratch: its counters and what
// its checks found belong to the old address.
func (f *Fold) candidate(p *proxyState, addr string) {
	f.epochs++
	f.resetChecks(p)
	p.addr, p.epoch, p.passes, p.fails, p.lastProbe = addr, f.epochs, 0, 0, time.Time{}
}

// forget stops probing p and drops its counters and checks (it stays out,
// or leaves).
func (f *Fold) forget(p *proxyState) {
	if p.inRotation {
		f.leave(p)
	}
	f.epochs++
	f.resetChecks(p)
	p.addr, p.epoch, p.passes, p.fails, p.lastProbe = "", f.epochs, 0, 0, time.Time{}
}

// resetChecks drops what p's checks found; its check record, if it had
// one, goes.
func (f *Fold) resetChecks(p *proxyState) {
	if f.verdict(p) != "" {
		f.checksGen++
	}
	// Marked even without a record: the bucket may hold one of its
	// address from another process, which goes with it.
	f.markCheck(p)
	p.egress, p.reported, p.bad, p.egressTurn = "", false, nil, 0
	p.openState, p.openAt, p.openPending, p.checkAt = "", time.Time{}, false, time.Time{}
}

func (f *Fold) enter(p *proxyState, at time.Time) {
	f.setGrace(p, time.Time{})
	p.inRotation, p.since = true, at
	f.touch(p)
	f.inRot++
	f.stats.Entries++
}

// leave takes p out of the rotation, if it is in, and reports whether it was.
func (f *Fold) leave(p *proxyState) bool {
	if !p.inRotation {
		return false
	}
	f.setGrace(p, time.Time{})
	p.inRotation, p.since = false, time.Time{}
	f.touch(p)
	f.inRot--
	f.stats.Exits++
	return true
}

// InRotation reports whether id is in the rotation.
func (f *Fold) InRotation(id string) bool {
	p := f.proxies[id]
	return p != nil && p.inRotation
}

// Len is the size of the rotation.
func (f *Fold) Len() int { return f.inRot }
