package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"proxyfleet/messages"
)

// WatchMode chooses how PrintWatch writes.
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

// WatchOption configures PrintWatch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	mode WatchMode
	now  func() time.Time
	term *bool // overrides the terminal check, for tests
}

// WithWatchMode sets how PrintWatch writes; the default is WatchAuto.
func WithWatchMode(m WatchMode) WatchOption { return func(o *watchOptions) { o.mode = m } }

// WatchColumns are the columns of PrintWatch's table.
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

// PrintWatch writes a watch to out until its stream ends: the initial
// picture first, then every update. In table mode it keeps the latest event
// per proxy and redraws the table (columns WatchColumns) at most every
// refresh (default 1s), and every refresh on a terminal, clearing the
// screen first, so ages move on; when the stream ends it draws the last
// picture once more, unless on a terminal. It returns nil when the stream
// ended with its context or by Stop, else the stream's error or the first
// write error. It does not stop wt.
func PrintWatch(out io.Writer, wt *Watcher, refresh time.Duration, opts ...WatchOption) error {
	o := watchOptions{now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	if refresh <= 0 {
		refresh = time.Second
	}
	term := isTerminal(out)
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

	bw := bufio.NewWriter(out)
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
	apply := func(u Update) error {
		switch mode {
		case WatchLines:
			if _, err := fmt.Fprintln(bw, FormatEvent(u.Event)); err != nil {
				return err
			}
			return bw.Flush()
		case WatchJSON:
			b, _ := json.Marshal(u.Event)
			if _, err := bw.Write(append(b, '\n')); err != nil {
				return err
			}
			return bw.Flush()
		}
		latest[u.Event.ID] = u.Event
		dirty = true
		return nil
	}
	for _, u := range wt.Initial() {
		if err := apply(u); err != nil {
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
		case u, ok := <-wt.Updates():
			if !ok {
				if err := wt.Err(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					return err
				}
				if mode == WatchTable && dirty && !term {
					return draw() // the last picture, for a log or a pipe
				}
				return nil
			}
			if err := apply(u); err != nil {
				return err
			}
			if mode == WatchTable && o.now().Sub(lastDraw) >= refresh {
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
