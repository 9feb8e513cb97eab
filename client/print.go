package client

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"proxyfleet/messages"
)

// WriteJSON writes v as indented JSON and a newline: the --json form of any
// value this package returns (Outcome, Status, []Status, messages.Rotation).
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTab(w io.Writer) tab {
	b := bufio.NewWriterSize(w, 64<<10)
	return tab{tabwriter.NewWriter(b, 0, 0, 2, ' ', 0), b}
}

// tab is a tabwriter over a buffer: the tabwriter writes each cell and
// its padding apart, which unbuffered is a system call each on a terminal
// or a pipe. Flush writes out both.
type tab struct {
	*tabwriter.Writer
	b *bufio.Writer
}

// Flush writes out the table, then the buffer.
func (t tab) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	return t.b.Flush()
}

// dash stands in for an empty cell, so columns stay aligned for awk.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine keeps a reason on its row.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// Age formats how long ago t was, coarsely (42s, 5m, 3h, 2d); "-" for a
// zero time.
func Age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// StatusColumns are the columns of PrintStatusTable. DESIRED is left out
// when no desired record was read (the user may not read PROXY_DESIRED).
var StatusColumns = []string{"ID", "DESIRED", "STATE", "HOST", "ADDR", "SOURCE", "EGRESS", "CHECK", "SEQ", "AGE", "REASON"}

// PrintStatusTable writes one row per proxy: its desired op (when readable),
// observed state, host, address, address source, health's verdict (ok,
// open, leaky; its reason takes the REASON column of a refused proxy), the
// egress addresses its plan gave it (the first, and how many more), event
// seq, the event's age and reason.
func PrintStatusTable(w io.Writer, sts []Status) error {
	return printStatusTable(w, sts, time.Now())
}

func printStatusTable(w io.Writer, sts []Status, now time.Time) error {
	withDesired := len(sts) == 0
	for _, s := range sts {
		withDesired = withDesired || !s.DesiredUnread
	}
	cols := StatusColumns
	if !withDesired {
		cols = append([]string{cols[0]}, cols[2:]...)
	}
	tw := newTab(w)
	fmt.Fprintln(tw, strings.Join(cols, "\t"))
	for _, s := range sts {
		desired, host := "", ""
		if s.Desired != nil {
			desired, host = s.Desired.Op, s.Desired.Host
		}
		var seq, age, source, reason, egress string
		if ev := s.Event; ev != nil {
			if ev.Host != "" {
				host = ev.Host
			}
			seq, age, source, reason = fmt.Sprint(ev.Seq), Age(now, ev.At), ev.Source, oneLine(ev.Reason)
			egress = EgressSummary(ev.Egress)
		} else if r := s.Result; r != nil && IsFailure(r.Outcome) {
			reason = oneLine(r.Outcome + ": " + r.Reason)
		}
		check := ""
		if c := s.currentCheck(); c != nil {
			check = c.Verdict
			if c.Verdict != messages.VerdictOK && c.Reason != "" {
				reason = oneLine(c.Reason)
			}
		}
		row := []string{s.ID, dash(desired), s.State(), dash(host), dash(s.Addr()), dash(source), dash(egress), dash(check), dash(seq), dash(age), dash(reason)}
		if !withDesired {
			row = append(row[:1], row[2:]...)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// PrintStatus writes everything known of one proxy, a field per line.
func PrintStatus(w io.Writer, s Status) error {
	tw := newTab(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", s.ID)
	row("state", s.State())
	row("converged", fmt.Sprint(s.Converged()))
	if d := s.Desired; d != nil {
		row("desired", fmt.Sprintf("%s (command %s, sequence %d, at %s)", d.Op, d.CommandID, d.Seq, d.At.Format(time.RFC3339)))
		if d.Op == messages.OpCreate {
			row("host", dash(d.Host))
			if d.PrevHost != "" {
				row("previous host", d.PrevHost)
			}
			row("image", dash(d.Image))
			row("cpus", fmt.Sprint(d.CPUs))
			row("memory", fmt.Sprintf("%d MiB", d.MemoryMiB))
			if len(d.Labels) > 0 {
				keys := make([]string, 0, len(d.Labels))
				for k := range d.Labels {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for i, k := range keys {
					keys[i] = k + "=" + d.Labels[k]
				}
				row("labels", strings.Join(keys, ","))
			}
		}
	} else if s.DesiredUnread {
		row("desired", "- (this user may not read "+messages.BucketDesired+")")
	} else {
		row("desired", "- (no record)")
	}
	if r := s.Result; r != nil {
		line := fmt.Sprintf("%s %s (command %s, at %s)", r.Op, r.Outcome, r.CommandID, r.At.Format(time.RFC3339))
		if r.Field != "" {
			line += ", field " + r.Field
		}
		if r.Reason != "" {
			line += ": " + oneLine(r.Reason)
		}
		row("last result", line)
	}
	if ev := s.Event; ev != nil {
		row("event", fmt.Sprintf("%s on %s, seq %d, command %s, %s ago (%s)", ev.State, dash(ev.Host), ev.Seq,
			dash(ev.CommandID), Age(time.Now(), ev.At), ev.At.Format(time.RFC3339)))
		row("addr", dash(s.Addr()))
		row("source", dash(ev.Source))
		if len(ev.Egress) > 0 {
			row("addresses", strings.Join(ev.Egress, " "))
		}
		if ev.Reason != "" {
			reason := ev.Reason
			if ev.Class != "" {
				reason += " (" + ev.Class + ")"
			}
			row("reason", reason)
		}
	} else {
		row("event", "- (none)")
	}
	if c := s.currentCheck(); c != nil {
		line := c.Verdict
		if c.Reason != "" {
			line += ": " + oneLine(c.Reason)
		}
		row("health", fmt.Sprintf("%s (checked at %s, %s ago)", line, c.Addr, Age(time.Now(), c.At)))
		row("egress", dash(c.Egress))
	}
	return tw.Flush()
}

// PrintResults writes one row per result.
func PrintResults(w io.Writer, rs []messages.Result) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "ID\tOP\tOUTCOME\tCOMMAND\tAT\tFIELD\tREASON")
	for _, r := range rs {
		at := ""
		if !r.At.IsZero() {
			at = r.At.Format(time.RFC3339)
		}
		reason := oneLine(r.Reason)
		if r.Class != "" && reason != "" {
			reason += " (" + r.Class + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Op, r.Outcome, r.CommandID, dash(at), dash(r.Field), dash(reason))
	}
	return tw.Flush()
}

// PrintOutcome writes what became of a command: a summary line, then its
// results if it was waited for.
func PrintOutcome(w io.Writer, o Outcome) error {
	dup := ""
	if o.Duplicate {
		dup = " (duplicate: already published)"
	}
	final := "not waited for"
	if o.Final != nil {
		final = o.Final.Outcome
	} else if len(o.Results) > 0 {
		final = "no final outcome yet (last: " + o.Results[len(o.Results)-1].Outcome + ")"
	}
	if _, err := fmt.Fprintf(w, "%s %s: command %s, sequence %d%s: %s\n", o.Op, o.ID, o.CommandID, o.Sequence, dup, final); err != nil {
		return err
	}
	if len(o.Results) == 0 {
		return nil
	}
	return PrintResults(w, o.Results)
}

// PrintRotation writes a rotation snapshot: a summary line, then one row per
// proxy.
func PrintRotation(w io.Writer, rot messages.Rotation) error {
	at := "-"
	if !rot.At.IsZero() {
		at = rot.At.Format(time.RFC3339)
	}
	if _, err := fmt.Fprintf(w, "rotation version %d, %d proxies, at %s\n", rot.Version, len(rot.Proxies), at); err != nil {
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "ID\tADDR\tEGRESS\tADDRESSES\tHOST\tSINCE")
	now := time.Now()
	for _, p := range rot.Proxies {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Addr, dash(p.Egress), dash(EgressSummary(p.EgressAddrs)), dash(p.Host), Age(now, p.Since))
	}
	return tw.Flush()
}

// EgressSummary is a proxy's egress list in a table: its first address
// and how many more ("198.18.101.5 +16"); "" for none.
func EgressSummary(items []string) string {
	as, err := messages.ExpandEgress(items)
	switch {
	case err != nil:
		return "unreadable"
	case len(as) == 0:
		return ""
	case len(as) == 1:
		return as[0].String()
	}
	return fmt.Sprintf("%s +%d", as[0], len(as)-1)
}

// FormatEvent is the one-line form of a state event used by Watch when it
// does not draw a table.
func FormatEvent(ev messages.StateEvent) string {
	var b strings.Builder
	at := "-"
	if !ev.At.IsZero() {
		at = ev.At.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(&b, "%s %s %s host=%s", at, ev.ID, ev.State, dash(ev.Host))
	if ev.IP != "" {
		addr := ev.IP
		if ev.Port != 0 {
			addr = fmt.Sprintf("%s:%d", ev.IP, ev.Port)
		}
		fmt.Fprintf(&b, " addr=%s source=%s", addr, dash(ev.Source))
	}
	fmt.Fprintf(&b, " seq=%d command=%s", ev.Seq, dash(ev.CommandID))
	if ev.Reason != "" {
		fmt.Fprintf(&b, " reason=%q", ev.Reason)
		if ev.Class != "" {
			fmt.Fprintf(&b, " class=%s", ev.Class)
		}
	}
	return b.String()
}
