package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// WatchMode chooses how Watch writes.
type WatchMode int

const (
	// WatchAuto draws a table on a terminal and writes lines otherwise.
	WatchAuto WatchMode = iota
	// WatchTable redraws the table (clearing the screen only on a terminal).
	WatchTable
	// WatchLines writes one FormatEvent line per event.
	WatchLines
	// WatchJSON writes one JSON state event per line.
	WatchJSON
)

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	mode WatchMode
	now  func() time.Time
	term *bool // overrides the terminal check, for tests
}

// WithWatchMode sets how Watch writes; the default is WatchAuto.
func WithWatchMode(m WatchMode) WatchOption { return func(o *watchOptions) { o.mode = m } }

// WatchColumns are the columns of Watch's table.
var WatchColumns = []string{"ID", "STATE", "HOST", "IP", "SOURCE", "SEQ", "AGE", "REASON"}

// clearScreen moves the cursor home and clears the screen (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

// isTerminal reports whether w is a character device, i.e. a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Watch follows PROXY_EVENTS until ctx is done: it starts with the latest
// event of every proxy (read to its end first, so that a refused read is an
// error rather than an empty screen), then writes new events as they come.
// In table mode it keeps the latest event per proxy and redraws the table
// (columns WatchColumns) at most every refresh (default 1s), and every
// refresh on a terminal, clearing the screen first, so ages move on. It
// returns nil when ctx ends, or the first write or read error; every
// goroutine it started has stopped by then.
func (c *Client) Watch(ctx context.Context, w io.Writer, refresh time.Duration, opts ...WatchOption) error {
	o := watchOptions{now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	if refresh <= 0 {
		refresh = time.Second
	}
	term := isTerminal(w)
	if o.term != nil {
		term = *o.term
	}
	mode := o.mode
	if mode == WatchAuto {
		mode = WatchLines
		if term {
			mode = WatchTable
		}
	}

	st, err := c.stream(ctx, messages.StreamEvents)
	if err != nil {
		return err
	}
	// The current picture first, read to its end, so that a refused or
	// broken read fails here instead of leaving an empty screen; then
	// every event after it. Whatever both see is dropped by its stream
	// sequence.
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	startSeq := info.State.LastSeq
	prefix := c.subj.Prefix + ".state."
	decode := func(m jetstream.Msg) (seenEvent, bool) {
		var ev messages.StateEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return seenEvent{}, false
		}
		if ev.ID == "" {
			ev.ID = strings.TrimPrefix(m.Subject(), prefix)
		}
		meta, err := m.Metadata()
		if err != nil {
			return seenEvent{}, false
		}
		return seenEvent{ev: ev, sseq: meta.Sequence.Stream}, true
	}
	var initial []seenEvent
	err = c.readStream(ctx, messages.StreamEvents, c.subj.StateAll(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg) {
		if se, ok := decode(m); ok {
			initial = append(initial, se)
			startSeq = max(startSeq, se.sseq)
		}
	})
	if err != nil {
		return fmt.Errorf("watch: read the current states: %w", err)
	}
	sort.Slice(initial, func(i, j int) bool { return initial[i].sseq < initial[j].sseq })

	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.subj.StateAll()},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    startSeq + 1,
	})
	if err != nil {
		return fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	events := make(chan seenEvent, 256)
	stop := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		se, ok := decode(m)
		if !ok {
			return
		}
		select {
		case events <- se:
		case <-stop:
		}
	})
	if err != nil {
		return fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	defer func() {
		close(stop) // unblocks a handler waiting to hand over an event
		cc.Stop()
		<-cc.Closed()
	}()

	bw := bufio.NewWriter(w)
	latest := map[string]messages.StateEvent{}
	var lastDraw time.Time
	dirty := false
	draw := func() error {
		if term {
			if _, err := bw.WriteString(clearScreen); err != nil {
				return err
			}
		} else if !lastDraw.IsZero() {
			if err := bw.WriteByte('\n'); err != nil {
				return err
			}
		}
		now := o.now()
		if err := renderWatchTable(bw, latest, now); err != nil {
			return err
		}
		lastDraw, dirty = now, false
		return bw.Flush()
	}

	// apply takes one event; it reports false for one already seen.
	lastSeq := map[string]uint64{}
	apply := func(se seenEvent) (bool, error) {
		if lastSeq[se.ev.ID] >= se.sseq {
			return false, nil
		}
		lastSeq[se.ev.ID] = se.sseq
		switch mode {
		case WatchLines:
			if _, err := fmt.Fprintln(bw, FormatEvent(se.ev)); err != nil {
				return true, err
			}
			return true, bw.Flush()
		case WatchJSON:
			b, _ := json.Marshal(se.ev)
			if _, err := bw.Write(append(b, '\n')); err != nil {
				return true, err
			}
			return true, bw.Flush()
		}
		latest[se.ev.ID] = se.ev
		dirty = true
		return true, nil
	}
	for _, se := range initial {
		if _, err := apply(se); err != nil {
			return err
		}
	}
	if mode == WatchTable {
		if err := draw(); err != nil {
			return err
		}
	}

	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if mode == WatchTable && dirty && !term {
				return draw() // the last picture, for a log or a pipe
			}
			return nil
		case se := <-events:
			fresh, err := apply(se)
			if err != nil {
				return err
			}
			if fresh && mode == WatchTable && o.now().Sub(lastDraw) >= refresh {
				if err := draw(); err != nil {
					return err
				}
			}
		case <-tick.C:
			if mode == WatchTable && (dirty || term) {
				if err := draw(); err != nil {
					return err
				}
			}
		}
	}
}

// seenEvent is a state event and its PROXY_EVENTS stream sequence, which,
// unlike the event's own seq, orders events across a proxy's lifetimes.
type seenEvent struct {
	ev   messages.StateEvent
	sseq uint64
}

// renderWatchTable writes the header line and the table of the latest
// events, sorted by id.
func renderWatchTable(w io.Writer, latest map[string]messages.StateEvent, now time.Time) error {
	ids := make([]string, 0, len(latest))
	counts := map[string]int{}
	for id, ev := range latest {
		ids = append(ids, id)
		counts[ev.State]++
	}
	sort.Strings(ids)
	var sum []string
	for _, s := range []string{messages.StateRunning, messages.StateProvisioning, messages.StateFailed, messages.StateDeleting, messages.StateDeleted} {
		if counts[s] > 0 {
			sum = append(sum, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	summary := "no proxies"
	if len(sum) > 0 {
		summary = strings.Join(sum, ", ")
	}
	if _, err := fmt.Fprintf(w, "proxyfleet watch  %s  %s\n", now.UTC().Format(time.RFC3339), summary); err != nil {
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, strings.Join(WatchColumns, "\t"))
	for _, id := range ids {
		ev := latest[id]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", id, dash(ev.State), dash(ev.Host), dash(ev.IP),
			dash(ev.Source), ev.Seq, Age(now, ev.At), dash(oneLine(ev.Reason)))
	}
	return tw.Flush()
}
