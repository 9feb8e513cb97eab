package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"proxyfleet/addrplan"
	"proxyfleet/messages"
)

// addressesCmd is `proxyfleet addresses [HOST]`: each host's address plan,
// its slots held, cooling and free, and which proxy holds which.
type addressesCmd struct{}

func (*addressesCmd) flags(*flag.FlagSet)    {}
func (*addressesCmd) timeout() time.Duration { return defaultTimeout }

// hostAddresses is one host in `addresses`.
type hostAddresses struct {
	Host string `json:"host"`
	// Plan is the host's plan as its record says; absent: the host has
	// none (its proxies' addresses are its network's DHCP's).
	Plan *messages.AddrPlan `json:"plan,omitempty"`
	// Error says why the record's plan could not be read.
	Error   string         `json:"error,omitempty"`
	IPv4    *familyUsage   `json:"ipv4,omitempty"`
	IPv6    *familyUsage   `json:"ipv6,omitempty"`
	Proxies []proxyAddrs   `json:"proxies,omitempty"`
	Cooling []coolingAddrs `json:"cooling,omitempty"`
}

// familyUsage counts one family's slots (an IPv6 slot is PerSlot
// addresses).
type familyUsage struct {
	Slots   int `json:"slots"`
	PerSlot int `json:"per_slot"`
	Held    int `json:"held"`
	Cooling int `json:"cooling"`
	Free    int `json:"free"`
}

// proxyAddrs are the addresses one proxy holds.
type proxyAddrs struct {
	ID   string       `json:"id"`
	IPv4 netip.Addr   `json:"ipv4,omitzero"`
	IPv6 []netip.Addr `json:"ipv6,omitempty"`
}

// coolingAddrs are a freed slot's addresses, given again no sooner than
// Until.
type coolingAddrs struct {
	Addrs []netip.Addr `json:"addresses"`
	Freed time.Time    `json:"freed"`
	Until time.Time    `json:"until"`
}

func (*addressesCmd) run(ctx context.Context, in *invocation) error {
	cl, err := in.client()
	if err != nil {
		return err
	}
	var only []string
	if in.id != "" {
		only = []string{in.id}
	}
	recs, err := cl.HostRecords(ctx, only...)
	if err != nil {
		return err
	}
	if in.id != "" && len(recs) == 0 {
		return fmt.Errorf("host %s: no record in %s (no worker has recorded it)", in.id, messages.BucketHosts)
	}
	now := time.Now()
	out := make([]hostAddresses, 0, len(recs))
	for _, rec := range recs {
		out = append(out, addressesOf(rec, now))
	}
	return in.output(out, func() error { return printAddresses(in.stdout, out) })
}

// addressesOf reads one host's record as `addresses` shows it.
func addressesOf(rec messages.HostRecord, now time.Time) hostAddresses {
	ha := hostAddresses{Host: rec.Host, Plan: rec.Plan}
	if rec.Plan == nil {
		return ha
	}
	p, err := addrplan.New(rec.Host, *rec.Plan)
	if err != nil {
		ha.Error = err.Error()
		return ha
	}
	st, err := rec.Addresses.Decode()
	if err != nil {
		ha.Error = err.Error()
		return ha
	}
	v4, v6 := p.Usage(&st, now)
	if v4.Slots > 0 {
		ha.IPv4 = &familyUsage{Slots: v4.Slots, PerSlot: 1, Held: v4.Held, Cooling: v4.Cooling, Free: v4.Free}
	}
	if v6.Slots > 0 {
		ha.IPv6 = &familyUsage{Slots: v6.Slots, PerSlot: p.PerProxy6(), Held: v6.Held, Cooling: v6.Cooling, Free: v6.Free}
	}
	for id, s := range st.Slots {
		pa := proxyAddrs{ID: id}
		if s.V4 != 0 {
			pa.IPv4 = p.IPv4(s.V4)
		}
		if s.V6 != 0 {
			pa.IPv6 = p.IPv6(s.V6)
		}
		ha.Proxies = append(ha.Proxies, pa)
	}
	sort.Slice(ha.Proxies, func(i, j int) bool { return ha.Proxies[i].ID < ha.Proxies[j].ID })
	cool := func(sp messages.SlotSpace, addrs func(int) []netip.Addr) {
		for k, at := range sp.Freed {
			if until := at.Add(p.ReuseAfter()); until.After(now) {
				if a := addrs(k); len(a) > 0 {
					ha.Cooling = append(ha.Cooling, coolingAddrs{Addrs: a, Freed: at, Until: until})
				}
			}
		}
	}
	cool(st.V4, func(k int) []netip.Addr {
		if a := p.IPv4(k); a.IsValid() {
			return []netip.Addr{a}
		}
		return nil
	})
	cool(st.V6, p.IPv6)
	sort.Slice(ha.Cooling, func(i, j int) bool { return ha.Cooling[i].Until.Before(ha.Cooling[j].Until) })
	return ha
}

// printAddresses renders `addresses`: a line a host and family, then the
// proxies holding addresses, then the addresses cooling.
func printAddresses(w io.Writer, hosts []hostAddresses) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tFAMILY\tSLOTS\tHELD\tCOOLING\tFREE\tPLAN")
	for _, h := range hosts {
		switch {
		case h.Plan == nil:
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tnone (the network's DHCP)\n", h.Host)
		case h.Error != "":
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tunreadable: %s\n", h.Host, h.Error)
		}
		for _, f := range []struct {
			name string
			u    *familyUsage
			of   []string
		}{{"ipv4", h.IPv4, planOf(h.Plan, true)}, {"ipv6", h.IPv6, planOf(h.Plan, false)}} {
			if f.u == nil {
				continue
			}
			desc := fmt.Sprint(f.of)
			if f.u.PerSlot > 1 {
				desc += fmt.Sprintf(", %d addresses a slot", f.u.PerSlot)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", h.Host, f.name, f.u.Slots, f.u.Held, f.u.Cooling, f.u.Free, desc)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !slices.ContainsFunc(hosts, func(h hostAddresses) bool { return len(h.Proxies) > 0 || len(h.Cooling) > 0 }) {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tHELD BY\tIPV4\tIPV6")
	for _, h := range hosts {
		for _, p := range h.Proxies {
			v4 := "-"
			if p.IPv4.IsValid() {
				v4 = p.IPv4.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Host, p.ID, v4, span(p.IPv6))
		}
		for _, c := range h.Cooling {
			who := "cooling until " + c.Until.UTC().Format(time.RFC3339)
			if c.Addrs[0].Is4() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t-\n", h.Host, who, c.Addrs[0])
			} else {
				fmt.Fprintf(tw, "%s\t%s\t-\t%s\n", h.Host, who, span(c.Addrs))
			}
		}
	}
	return tw.Flush()
}

func planOf(p *messages.AddrPlan, v4 bool) []string {
	if p == nil {
		return nil
	}
	if v4 {
		return p.IPv4
	}
	return p.IPv6
}

// span writes consecutive addresses as first-last (n).
func span(as []netip.Addr) string {
	switch len(as) {
	case 0:
		return "-"
	case 1:
		return as[0].String()
	}
	return fmt.Sprintf("%s-%s (%d)", as[0], as[len(as)-1], len(as))
}
