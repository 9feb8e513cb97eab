package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// TestUsageListsEveryVerb: each client verb in the table is in the usage
// text, and each is dispatched (its --help names it and exits 0).
func TestUsageListsEveryVerb(t *testing.T) {
	for _, v := range verbs {
		if !strings.Contains(usage, "\n  proxyfleet "+v.name+" ") && !strings.Contains(usage, "\n  proxyfleet "+v.name+"\n") &&
			!strings.Contains(usage, "\n  proxyfleet "+strings.ReplaceAll(v.name, " ", "     ")+" ") &&
			!(strings.HasPrefix(v.name, "dead ") && strings.Contains(usage, "\n  proxyfleet dead     ls | replay")) {
			t.Errorf("usage lacks %s", v.name)
		}
		var out bytes.Buffer
		err := run(context.Background(), strings.Fields(v.name)[0], append(strings.Fields(v.name)[1:], "-h"), &out, &out)
		if err != nil || !strings.HasPrefix(out.String(), "Usage: proxyfleet "+v.name+" ") {
			t.Errorf("%s -h: %v, %q", v.name, err, out.String())
		}
	}
}

// TestClientVerbs runs the client verbs through run against an embedded
// NATS server with the topology and no worker (the test publishes the
// results and events), checking their output and exit codes as README.md and
// docs/CLI.md document them.
func TestClientVerbs(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	publish := func(subject string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := js.Publish(ctx, subject, b); err != nil {
			t.Fatal(err)
		}
	}
	// cli runs one verb; code is its exit code (an error that is no
	// exitError exits 1, its text on stderr as main writes it).
	cli := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		var o, e bytes.Buffer
		err := run(ctx, args[0], append(args[1:], "--nats-url", srv.ClientURL()), &o, &e)
		var ee exitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.code
		default:
			code = 1
			e.WriteString("proxyfleet " + args[0] + ": " + err.Error() + "\n")
		}
		return o.String(), e.String(), code
	}
	want := func(what string, ok bool, stdout, stderr string) {
		t.Helper()
		wantCLI(t, what, ok, stdout, stderr)
	}

	// Usage errors exit 2 and name the form.
	o, e, code := cli("create")
	want("create without an id", code == 2 && e == "usage: proxyfleet create ID [flags]\n" && o == "", o, e)
	o, e, code = cli("list", "p1")
	want("list with an id", code == 2 && e == "usage: proxyfleet list [flags]\n", o, e)
	o, e, code = cli("create", "p1", "--label", "nokv")
	want("a bad label", code == 2 && strings.HasPrefix(e, `invalid value "nokv" for flag -label: want key=value, got "nokv"`), o, e)
	for verb, flags := range map[string][]string{
		"create": {"-host", "-image", "-cpus", "-memory-mib", "-label", "-command-id", "-wait"},
		"delete": {"-command-id", "-wait"}, "list": {"-all", "-host", "-state", "-label", "-after", "-limit"}, "watch": {"-refresh"}, "rotation": {"-http"},
		"get": {"-server", "-context", "-creds", "-nkey", "-user", "-password", "-tlsca", "-tlscert", "-tlskey", "-prefix", "-config", "-json", "-timeout"},
	} {
		o, e, code = cli(verb, "-h")
		for _, f := range flags {
			want(verb+" -h lists "+f, code == 0 && strings.HasPrefix(o, "Usage: proxyfleet "+verb+" ") && (strings.Contains(o, "\n  -"+f+" ") || strings.Contains(o, "\n  -"+f+"\n")), o, e)
		}
	}

	// A proxy nobody knows exits 1.
	o, e, code = cli("get", "p1")
	want("get of an unknown proxy", code == 1 && e == "proxy p1: not found\n" && o == "", o, e)

	// create and delete without --wait: sent, not waited for.
	o, e, code = cli("create", "p1", "--command-id", "c1", "--label", "team=a")
	want("create p1", code == 0 && o == "create p1: command c1, sequence 1: not waited for\n" && e == "", o, e)
	o, e, code = cli("delete", "p2", "--command-id", "d2", "--json")
	var out client.Outcome
	want("delete p2 --json", code == 0 && json.Unmarshal([]byte(o), &out) == nil && out.ID == "p2" && out.CommandID == "d2" && out.Sequence == 2, o, e)

	// --wait on a command whose answers are stored: acceptance on stderr,
	// the results on stdout, and a failure exits 1.
	o, e, code = cli("create", "p3", "--command-id", "c3")
	want("create p3", code == 0, o, e)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	publish(subj.Result("p3"), messages.Result{V: 1, ID: "p3", CommandID: "c3", Op: "create", Outcome: messages.OutcomeAccepted, At: at})
	publish(subj.Result("p3"), messages.Result{V: 1, ID: "p3", CommandID: "c3", Op: "create", Outcome: messages.OutcomeFailed, Reason: "boom", Class: "permanent", At: at})
	o, e, code = cli("create", "p3", "--command-id", "c3", "--wait")
	want("create p3 --wait, failed", code == 1 && e == "create p3: accepted, command c3\n" &&
		strings.HasPrefix(o, "create p3: command c3, sequence 3 (duplicate: already published): failed\n") &&
		strings.Contains(o, "p3  create  failed    c3       2026-01-02T03:04:05Z  -      boom (permanent)\n"), o, e)

	// Reads: get, list, rotation, watch.
	publish(subj.State("p1"), messages.StateEvent{V: 1, ID: "p1", State: messages.StateRunning, Host: "h1", IP: "198.18.0.1", Port: 3128, Source: "sim", Seq: 2, At: time.Now().UTC()})
	o, e, code = cli("get", "p1")
	want("get p1", code == 0 && strings.Contains(o, "\nstate:      running\n") && strings.Contains(o, "\naddr:       198.18.0.1:3128\n"), o, e)
	o, e, code = cli("get", "p1", "--json")
	var st client.Status
	want("get p1 --json", code == 0 && json.Unmarshal([]byte(o), &st) == nil && st.Event != nil && st.Event.IP == "198.18.0.1", o, e)
	// Health's check of p1: its verdict in list, its egress in rotation.
	ckv, err := js.KeyValue(ctx, messages.BucketChecks)
	if err != nil {
		t.Fatal(err)
	}
	chk, _ := json.Marshal(messages.CheckRecord{V: 1, ID: "p1", Addr: "198.18.0.1:3128", Egress: "203.0.113.7", Verdict: messages.VerdictOK, At: time.Now().UTC()})
	if _, err := ckv.Put(ctx, "p1", chk); err != nil {
		t.Fatal(err)
	}
	o, e, code = cli("list")
	want("list", code == 0 && strings.HasPrefix(o, "ID  DESIRED  STATE    HOST  ADDR             SOURCE  EGRESS  CHECK  SEQ  AGE  REASON\n") &&
		strings.Contains(o, "\np1  -        running  h1    198.18.0.1:3128  sim     -       ok     2 "), o, e)
	// list's filters and pages (p1 runs on h1; p3's create failed before
	// any event: pending, on no host).
	o, e, code = cli("list", "--state", "running")
	want("list --state running", code == 0 && strings.Contains(o, "\np1 ") && !strings.Contains(o, "\np3 "), o, e)
	o, e, code = cli("list", "--state", "pending", "--json")
	var page []client.Status
	want("list --state pending --json", code == 0 && json.Unmarshal([]byte(o), &page) == nil && len(page) == 1 && page[0].ID == "p3", o, e)
	o, e, code = cli("list", "--host", "h1")
	want("list --host h1", code == 0 && strings.Contains(o, "\np1 ") && !strings.Contains(o, "\np3 "), o, e)
	o, e, code = cli("list", "--limit", "1")
	want("list --limit 1", code == 0 && strings.Count(o, "\n") == 2 && strings.Contains(o, "\np1 ") &&
		e == "more proxies: the next page is --after p1\n", o, e)
	o, e, code = cli("list", "--limit", "1", "--after", "p1")
	want("list --limit 1 --after p1", code == 0 && strings.Count(o, "\n") == 2 && strings.Contains(o, "\np3 ") && e == "", o, e)
	o, e, code = cli("list", "--state", "up")
	want("list --state up", code == 2 && strings.Contains(e, `--state "up"`), o, e)
	kv, err := js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "p1", []byte("198.18.0.1:3128")); err != nil {
		t.Fatal(err)
	}
	o, e, code = cli("rotation")
	want("rotation", code == 0 && strings.HasPrefix(o, "rotation version 1, 1 proxies, at ") && strings.Contains(o, "\np1  198.18.0.1:3128  203.0.113.7  -          h1  "), o, e)
	// hosts: the records in PROXY_HOSTS, owners from the heartbeats in
	// PROXY_WORKERS.
	hkv, err := js.KeyValue(ctx, messages.BucketHosts)
	if err != nil {
		t.Fatal(err)
	}
	wkv, err := js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		t.Fatal(err)
	}
	put := func(kv jetstream.KeyValue, key string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	put(hkv, "h1", messages.HostRecord{V: 1, Host: "h1", MaxProxies: 20, Proxies: map[string]uint64{"p1": 1, "p3": 3}, State: messages.HostOK, Since: now})
	put(hkv, "h2", messages.HostRecord{V: 1, Host: "h2", MaxProxies: 3, State: messages.HostQuarantined, Since: now,
		Until: now.Add(time.Hour), CoolDownMS: 3600000, Reason: "list h2: injected fault (transient)"})
	put(wkv, "wk-1", messages.WorkerRecord{V: 1, ID: "wk-1", State: messages.WorkerActive, Hosts: []string{"h1", "h2", "h3"}, Owned: []string{"h1", "h2"}, At: now})
	put(wkv, "wk-2", messages.WorkerRecord{V: 1, ID: "wk-2", State: messages.WorkerDraining, Hosts: []string{"h1", "h2", "h3"}, Owned: []string{"h3"}, At: now})
	o, e, code = cli("hosts")
	want("hosts", code == 0 && strings.HasPrefix(o, "HOST  OWNER  PROXIES  STATE        SINCE  REASON\n") &&
		strings.Contains(o, "\nh1    wk-1   2/20     ok           0s     -\n") &&
		strings.Contains(o, "\nh2    wk-1   0/3      quarantined  0s     probe in 1h0m0s: list h2: injected fault (transient)\n") &&
		strings.Contains(o, "\nh3    wk-2   -        draining     0s     -\n"), o, e)
	o, e, code = cli("hosts", "--json")
	var hosts []map[string]any
	want("hosts --json", code == 0 && json.Unmarshal([]byte(o), &hosts) == nil && len(hosts) == 3 &&
		hosts[0]["host"] == "h1" && hosts[0]["owner"] == "wk-1" && hosts[0]["proxies"] == 2.0 && hosts[0]["max_proxies"] == 20.0 &&
		hosts[0]["state"] == "ok" && hosts[0]["since"] != nil &&
		hosts[1]["state"] == "quarantined" && hosts[2]["state"] == "draining" && hosts[2]["owner"] == "wk-2", o, e)

	// addresses: the plan and assignments in the records; h1 has a
	// plan, p1 and p3 hold slots, one IPv4 slot cools.
	put(hkv, "h1", messages.HostRecord{V: 1, Host: "h1", MaxProxies: 20, Proxies: map[string]uint64{"p1": 1, "p3": 3}, State: messages.HostOK, Since: now,
		Plan: &messages.AddrPlan{IPv4: []string{"203.0.113.8/29"}, IPv6: []string{"2001:db8:1:2::/64"}, IPv6PerProxy: 16},
		Addresses: messages.EncodeAddrs(messages.AddrState{
			Slots: map[string]messages.AddrSlots{"p1": {V4: 1, V6: 1}, "p3": {V4: 3, V6: 2}},
			V4:    messages.SlotSpace{Next: 3, Freed: map[int]time.Time{2: now.Add(-time.Minute)}},
			V6:    messages.SlotSpace{Next: 2},
		})})
	o, e, code = cli("addresses")
	lines := map[string]bool{} // each line's words, one space apart
	for _, l := range strings.Split(o, "\n") {
		lines[strings.Join(strings.Fields(l), " ")] = true
	}
	want("addresses", code == 0 && lines["HOST FAMILY SLOTS HELD COOLING FREE PLAN"] &&
		lines["h1 ipv4 6 2 1 3 [203.0.113.8/29]"] &&
		lines["h1 ipv6 32767 2 0 32765 [2001:db8:1:2::/64], 16 addresses a slot"] &&
		lines["h2 - - - - - none (the network's DHCP)"] &&
		lines["h1 p1 203.0.113.9 2001:db8:1:2::10-2001:db8:1:2::1f (16)"] &&
		lines["h1 p3 203.0.113.11 2001:db8:1:2::20-2001:db8:1:2::2f (16)"] &&
		lines["h1 cooling until "+now.Add(-time.Minute+time.Hour).Format(time.RFC3339)+" 203.0.113.10 -"], o, e)
	o, e, code = cli("addresses", "h1", "--json")
	var addrs []hostAddresses
	want("addresses h1 --json", code == 0 && json.Unmarshal([]byte(o), &addrs) == nil && len(addrs) == 1 &&
		addrs[0].IPv4.Free == 3 && len(addrs[0].Proxies) == 2 && addrs[0].Proxies[1].IPv4.String() == "203.0.113.11" &&
		len(addrs[0].Proxies[1].IPv6) == 16 && len(addrs[0].Cooling) == 1, o, e)
	if _, e, code = cli("addresses", "h9"); code == 0 || !strings.Contains(e, "host h9: no record") {
		t.Errorf("addresses h9: exit %d, %q", code, e)
	}

	o, e, code = cli("watch", "--timeout", "1s")
	want("watch", code == 0 && strings.HasSuffix(o, " p1 running host=h1 addr=198.18.0.1:3128 source=sim seq=2 command=-\n") && strings.Count(o, "\n") == 1 && e == "", o, e)
	o, e, code = cli("watch", "--timeout", "1s", "--json")
	var ev messages.StateEvent
	want("watch --json", code == 0 && json.Unmarshal([]byte(o), &ev) == nil && ev.ID == "p1" && ev.Seq == 2, o, e)
}
