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
// event of every proxy, then writes new events as they come. In table mode
// it keeps the latest event per proxy and redraws the table at most every
// refresh (default 1s), and every refresh on a terminal so ages move on. It
// returns nil when ctx ends, or the first write or subscription error; every
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
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.subj.StateAll()},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}

	events := make(chan messages.StateEvent, 256)
	stop := make(chan struct{})
	prefix := c.subj.Prefix + ".state."
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev messages.StateEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		if ev.ID == "" {
			ev.ID = strings.TrimPrefix(m.Subject(), prefix)
		}
		select {
		case events <- ev:
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

	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if mode == WatchTable && dirty && !term {
				return draw() // the last picture, for a log or a pipe
			}
			return nil
		case ev := <-events:
			switch mode {
			case WatchLines:
				if _, err := fmt.Fprintln(bw, FormatEvent(ev)); err != nil {
					return err
				}
				if err := bw.Flush(); err != nil {
					return err
				}
			case WatchJSON:
				b, _ := json.Marshal(ev)
				b = append(b, '\n')
				if _, err := bw.Write(b); err != nil {
					return err
				}
				if err := bw.Flush(); err != nil {
					return err
				}
			default:
				if prev, ok := latest[ev.ID]; ok && prev.Seq > ev.Seq {
					continue // an older event must not hide a newer one
				}
				latest[ev.ID] = ev
				dirty = true
				if o.now().Sub(lastDraw) >= refresh {
					if err := draw(); err != nil {
						return err
					}
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
