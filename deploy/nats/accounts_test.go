// Package nats_test checks deploy/nats/accounts.conf: a real nats-server
// loads it; admin sets up the streams and buckets, a worker, a health
// process and the client verbs each run as their own user with only that
// role's permissions and do their work; and every operation a role must not
// do is refused to it (after the same operation was seen to succeed for
// admin, so that the refusal is the permissions' doing).
package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/fleet"
	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/pool"
	"proxyfleet/rotation"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var subj = messages.NewSubjects("")

// conn is one connection as one user, recording every permission refusal
// the server reports on it.
type conn struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu      sync.Mutex
	refused []string
}

func (c *conn) refusals() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.refused...)
}

func (c *conn) refusedFor(subject string) bool {
	for _, r := range c.refusals() {
		if strings.Contains(r, `"`+subject+`"`) {
			return true
		}
	}
	return false
}

type suite struct {
	t   *testing.T
	srv *server.Server
}

// connect connects as user with the role's inbox prefix, as proxyfleet does.
func (s *suite) connect(user string) *conn {
	s.t.Helper()
	c := &conn{user: user}
	nc, err := nats.Connect(s.srv.ClientURL(), nats.UserInfo(user, user+"-pass"), nats.CustomInboxPrefix("_INBOX_"+user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				c.mu.Lock()
				c.refused = append(c.refused, err.Error())
				c.mu.Unlock()
			}
		}))
	if err != nil {
		s.t.Fatalf("connect as %s: %v", user, err)
	}
	s.t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		s.t.Fatal(err)
	}
	return c
}

func startServer(t *testing.T) *server.Server {
	for k, v := range map[string]string{
		"PROXYFLEET_ADMIN_PASSWORD": "admin-pass", "PROXYFLEET_CLIENT_PASSWORD": "client-pass",
		"PROXYFLEET_WORKER_PASSWORD": "worker-pass", "PROXYFLEET_HEALTH_PASSWORD": "health-pass", "PROXYFLEET_POOLS_PASSWORD": "pools-pass",
		"NATS_SYS_PASSWORD": "sys-pass",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile("accounts.conf")
	if err != nil {
		t.Fatalf("accounts.conf: %v", err)
	}
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// op is one operation, as the request (or subscription) the server judges.
type op struct {
	name    string
	subject string // the subject a refusal names
	body    string
	sub     bool // subscribe to subject instead of requesting on it
	// followed: subscribers that never answer may take what is
	// published there (followers of the rotation's feed).
	followed bool
	// undo puts back what the op did when admin ran it.
	undo func(t *testing.T, admin *conn)
}

// do runs o on c and reports whether the server answered (any answer,
// an API error or "no responders" included, is an answer: a refused
// publish is dropped and never answered).
func (o op) do(t *testing.T, c *conn) bool {
	t.Helper()
	if o.sub {
		sub, err := c.nc.SubscribeSync(o.subject)
		if err != nil {
			return false
		}
		defer func() { _ = sub.Unsubscribe() }()
		_ = c.nc.Flush()
		// A subscription that works receives what is published to it.
		probe := strings.Replace(o.subject, ">", "probe", 1)
		if err := c.nc.Publish(probe, []byte("x")); err != nil {
			return false
		}
		_, err = sub.NextMsg(time.Second)
		return err == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.nc.RequestWithContext(ctx, o.subject, []byte(o.body))
	if o.followed && errors.Is(err, context.DeadlineExceeded) {
		// A follower (the pool controller follows the rotation's
		// feed) took it without answering: done, unless the server
		// refused it, which it has said by now.
		return !c.refusedFor(o.subject)
	}
	return err == nil || errors.Is(err, nats.ErrNoResponders)
}

func undoStream(name string) func(*testing.T, *conn) {
	return func(t *testing.T, admin *conn) {
		t.Helper()
		if _, err := (topology.Topology{Subjects: subj}).Setup(ctxFor(t, 10*time.Second), admin.js); err != nil {
			t.Fatalf("set-up again after %s: %v", name, err)
		}
	}
}

func undoKey(bucket, key string) func(*testing.T, *conn) {
	return func(t *testing.T, admin *conn) {
		t.Helper()
		ctx := ctxFor(t, 10*time.Second)
		kv, err := admin.js.KeyValue(ctx, bucket)
		if err == nil {
			err = kv.Purge(ctx, key)
		}
		if err != nil {
			t.Fatalf("remove %s from %s: %v", key, bucket, err)
		}
	}
}

// undoConsumer waits for the worker to have recreated a deleted consumer.
func undoConsumer(stream, name string) func(*testing.T, *conn) {
	return func(t *testing.T, admin *conn) {
		t.Helper()
		poll.Until(t, "the worker to recreate "+name, 20*time.Second, func() bool {
			_, err := admin.js.Consumer(ctxFor(t, time.Second), stream, name)
			return err == nil
		})
	}
}

func undoPurgeSubject(stream, subject string) func(*testing.T, *conn) {
	return func(t *testing.T, admin *conn) {
		t.Helper()
		ctx := ctxFor(t, 10*time.Second)
		st, err := admin.js.Stream(ctx, stream)
		if err == nil {
			err = st.Purge(ctx, jetstream.WithPurgeSubject(subject))
		}
		if err != nil {
			t.Fatalf("purge %s: %v", subject, err)
		}
	}
}

// The operations that would stall or destroy the fleet, or let a role do
// another's job.
var (
	rmIntake = op{name: "consumer rm PROXY_CMDS intake", subject: "$JS.API.CONSUMER.DELETE.PROXY_CMDS.intake",
		undo: undoConsumer(messages.StreamCommands, topology.IntakeConsumer)}
	rmWork = op{name: "consumer rm PROXY_WORK work-h1", subject: "$JS.API.CONSUMER.DELETE.PROXY_WORK.work-h1",
		undo: undoConsumer(messages.StreamWork, topology.WorkConsumer("h1"))}
	rmStream = op{name: "stream rm PROXY_DEAD", subject: "$JS.API.STREAM.DELETE.PROXY_DEAD",
		undo: undoStream("stream rm")}
	purgeStream = op{name: "stream purge PROXY_DEAD", subject: "$JS.API.STREAM.PURGE.PROXY_DEAD"}
	addStream   = op{name: "stream add PF_EXTRA", subject: "$JS.API.STREAM.CREATE.PF_EXTRA",
		body: `{"name":"PF_EXTRA","subjects":["pf.extra.>"],"storage":"memory"}`,
		undo: func(t *testing.T, admin *conn) {
			if err := admin.js.DeleteStream(ctxFor(t, 10*time.Second), "PF_EXTRA"); err != nil {
				t.Fatal(err)
			}
		}}
	editStream = op{name: "stream edit PROXY_DEAD", subject: "$JS.API.STREAM.UPDATE.PROXY_DEAD",
		body: `{"name":"PROXY_DEAD","subjects":["proxy.dead.>"],"storage":"memory"}`}
	addDurable = op{name: "consumer add PROXY_CMDS sneak", subject: "$JS.API.CONSUMER.CREATE.PROXY_CMDS.sneak",
		body: `{"stream_name":"PROXY_CMDS","config":{"durable_name":"sneak","ack_policy":"explicit"}}`}
	getCommand = op{name: "stream get PROXY_CMDS", subject: "$JS.API.STREAM.MSG.GET.PROXY_CMDS",
		body: `{"last_by_subj":"proxy.cmd.create.p1"}`}
	getDesired = op{name: "stream get KV_PROXY_DESIRED", subject: "$JS.API.STREAM.MSG.GET.KV_PROXY_DESIRED",
		body: `{"last_by_subj":"$KV.PROXY_DESIRED.p1"}`}
	directDesired = op{name: "kv get PROXY_DESIRED p1", subject: "$JS.API.DIRECT.GET.KV_PROXY_DESIRED.$KV.PROXY_DESIRED.p1"}
	putRotation   = op{name: "kv put PROXY_ROTATION", subject: "$KV.PROXY_ROTATION.intruder", body: "198.18.0.9:3128",
		undo: undoKey(messages.BucketRotation, "intruder")}
	putChecks = op{name: "kv put PROXY_CHECKS", subject: "$KV.PROXY_CHECKS.intruder", body: "{}",
		undo: undoKey(messages.BucketChecks, "intruder")}
	putLeases = op{name: "kv put PROXY_LEASES", subject: "$KV.PROXY_LEASES.intruder", body: "{}",
		undo: undoKey(messages.BucketLeases, "intruder")}
	putDesired = op{name: "kv put PROXY_DESIRED", subject: "$KV.PROXY_DESIRED.intruder", body: "{}",
		undo: undoKey(messages.BucketDesired, "intruder")}
	pubState = op{name: "publish a state event", subject: "proxy.state.intruder", body: "{}",
		undo: undoPurgeSubject(messages.StreamEvents, "proxy.state.intruder")}
	pubRotation = op{name: "publish the rotation", subject: "proxy.rotation", body: "{}"}
	pubFeed     = op{name: "publish the rotation's feed", subject: "proxy.rotation.changes", body: "{}", followed: true}
	subPages    = op{name: "answer the rotation's pages", subject: "proxy.rotation.get", sub: true}
	pubCommand  = op{name: "publish a command", subject: "proxy.cmd.delete.intruder", body: `{"v":1,"id":"intruder"}`}
	subWorker   = op{name: "subscribe to the worker's inbox", subject: "_INBOX_worker.>", sub: true}
	subClient   = op{name: "subscribe to the client's inbox", subject: "_INBOX_client.>", sub: true}
	subHealth   = op{name: "subscribe to health's inbox", subject: "_INBOX_health.>", sub: true}
	subWork     = op{name: "subscribe to work items", subject: "proxy.work.>", sub: true}
	subPools    = op{name: "subscribe to the pools' inbox", subject: "_INBOX_pools.>", sub: true}
	putPool     = op{name: "kv put PROXY_POOLS", subject: "$KV.PROXY_POOLS.intruder", body: "{}",
		undo: undoKey(messages.BucketPools, "intruder")}
	putHost = op{name: "kv put PROXY_HOSTS", subject: "$KV.PROXY_HOSTS.intruder", body: "{}",
		undo: undoKey(messages.BucketHosts, "intruder")}
	putHealthLease = op{name: "kv put PROXY_LEASES health", subject: "$KV.PROXY_LEASES.health", body: "{}",
		undo: undoKey(messages.BucketLeases, "health")}
	rmPools = op{name: "consumer rm PROXY_POOLCMDS pools", subject: "$JS.API.CONSUMER.DELETE.PROXY_POOLCMDS.pools",
		undo: undoConsumer(messages.StreamPoolCommands, topology.PoolsConsumer)}
	pubWork = op{name: "publish a work item", subject: "proxy.work.h1.intruder", body: "{}",
		undo: undoPurgeSubject(messages.StreamWork, "proxy.work.h1.intruder")}
	putBan = op{name: "kv put PROXY_BANS", subject: "$KV.PROXY_BANS.203-0-113-9.intruder.example", body: "{}",
		undo: undoKey(messages.BucketBans, "203-0-113-9.intruder.example")}
	subBan = op{name: "answer ban requests", subject: "proxy.ban", sub: true}
)

var forbidden = map[string][]op{
	"client": {rmIntake, rmWork, rmStream, purgeStream, addStream, editStream, addDurable, getCommand, getDesired,
		directDesired, putRotation, putChecks, putDesired, pubState, pubRotation, pubFeed, subPages, subWorker, subHealth, subWork, putPool, rmPools, subPools,
		putBan, subBan},
	"pools": {rmIntake, rmWork, rmPools, rmStream, purgeStream, addStream, editStream, addDurable, getCommand, putDesired, putRotation,
		putChecks, putHost, putHealthLease, pubState, pubRotation, pubFeed, subPages, pubWork, subWorker, subClient, subHealth, putBan, subBan},
	"worker": {rmIntake, rmWork, rmStream, purgeStream, addStream, editStream, addDurable, putRotation, putChecks, putLeases,
		pubRotation, pubFeed, subPages, subClient, subHealth, putPool, rmPools, putBan, subBan},
	"health": {rmIntake, rmWork, rmStream, purgeStream, addStream, editStream, addDurable, putDesired, pubState,
		pubCommand, subWorker, subClient, putPool},
}

func TestRolesRunUnderTheirPermissions(t *testing.T) {
	s := &suite{t: t, srv: startServer(t)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := ctxFor(t, 2*time.Minute)

	// Admin sets up the streams and buckets.
	admin := s.connect("admin")
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, admin.js); err != nil {
		t.Fatalf("set-up as admin: %v", err)
	}

	hc := s.connect("health")
	h, err := health.New(hc.js, health.Config{Subjects: subj, HTTPAddr: health.NoHTTP, Logger: quiet, LeaseTTL: 3 * time.Second,
		SnapshotInterval: time.Millisecond}) // every version on the snapshot's subject too
	if err != nil {
		t.Fatal(err)
	}
	hr := runtest.Start(t, h.Run, h.Started(), time.Minute)
	defer func() {
		if err := hr.Stop(); err != nil {
			t.Errorf("health as health: %v", err)
		}
	}()

	wc := s.connect("worker")
	d, err := sim.New(sim.Config{Host: "h1", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wc.js, worker.Config{
		Subjects: subj, Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128},
		Providers: map[string]worker.Provider{"h1": d}, PollInterval: 10 * time.Millisecond, Logger: quiet,
		CheckInterval: 100 * time.Millisecond, ObserveInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	wr := runtest.Start(t, w.Run, w.Started(), time.Minute)
	defer func() {
		if err := wr.Stop(); err != nil {
			t.Errorf("worker as worker: %v", err)
		}
	}()

	pc := s.connect("pools")
	ctl, err := pool.New(pc.nc, pool.Config{Subjects: subj, Hosts: []pool.Host{{Name: "h1", MaxProxies: 10}}, Images: []string{"img"},
		DefaultImage: "img", Interval: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, CheckInterval: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	pr := runtest.Start(t, ctl.Run, ctl.Started(), time.Minute)
	defer func() {
		if err := pr.Stop(); err != nil {
			t.Errorf("pools as pools: %v", err)
		}
	}()

	cc := s.connect("client")
	cl, err := client.New(cc.nc, "")
	if err != nil {
		t.Fatal(err)
	}
	snapshots, err := cc.nc.SubscribeSync(subj.Rotation())
	if err != nil {
		t.Fatal(err)
	}
	feed, err := cc.nc.SubscribeSync(subj.RotationChanges())
	if err != nil {
		t.Fatal(err)
	}
	clientWork(t, ctx, cl, "p1")
	var snap messages.Rotation
	poll.Until(t, "a rotation snapshot with p1 on "+subj.Rotation(), 20*time.Second, func() bool {
		m, err := snapshots.NextMsg(10 * time.Millisecond)
		return err == nil && json.Unmarshal(m.Data, &snap) == nil && len(snap.Proxies) == 1 && snap.Proxies[0].ID == "p1"
	})
	// The client follows the feed and reads the pages, which health
	// answers to the client's inbox.
	poll.Until(t, "p1 entering on "+subj.RotationChanges(), 20*time.Second, func() bool {
		m, err := feed.NextMsg(10 * time.Millisecond)
		if err != nil {
			return false
		}
		c, err := messages.DecodeRotationChanges(m.Data)
		return err == nil && len(c.Changes) > 0 && c.Changes[0].ID == "p1" && c.Changes[0].Op == messages.ChangeEntered
	})
	pm, err := cc.nc.Request(subj.RotationGet(), []byte(`{"v":1}`), 5*time.Second)
	if err != nil {
		t.Fatalf("a page of the rotation as client: %v (refusals: client %v, health %v)", err, cc.refusals(), hc.refusals())
	}
	// (p1 may be gone already: clientWork deletes it.)
	if page, err := messages.DecodeRotationPage(pm.Data); err != nil || page.Version == 0 {
		t.Fatalf("a page of the rotation as client: %+v %v", page, err)
	}
	_ = feed.Unsubscribe()

	// The client (a gateway) reports p1; health, as health, takes the
	// report (p1 is the sim driver's, never probed: "unknown").
	body, _ := json.Marshal(messages.Report{V: 1, ID: "p1", Reason: "connect: connection refused", At: time.Now()})
	if err := cc.nc.Publish(subj.Report("p1"), body); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "health to take the client's report", 20*time.Second, func() bool {
		return h.Metrics().Reports[health.ReportUnknown] == 1
	})
	if cc.refusedFor(subj.Report("p1")) || hc.refusedFor(subj.ReportAll()) {
		t.Fatalf("reports refused: client %v, health %v", cc.refusals(), hc.refusals())
	}

	banWork(t, ctx, s, cl, quiet)

	// A VM leaks behind p1's delete: the worker's sweep, which reads the
	// record through the stream leader before it deletes, removes it
	// under the worker's permissions.
	if _, err := d.Create(ctx, fleet.Spec{ID: "p1", CommandID: "leak"}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the worker to sweep the leaked p1", 20*time.Second, func() bool {
		_, err := d.Get(ctx, "p1")
		return fleet.ClassOf(err) == fleet.ClassNotFound
	})

	// The client keeps a pool; the controller, as pools, makes, recycles
	// and deletes its member.
	poolWork(t, ctx, cl)
	hostWork(t, ctx, cl)

	// Admin reads what the client may not: the desired records.
	acl, err := client.New(admin.nc, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := acl.Get(ctx, "p1"); err != nil || st.DesiredUnread || st.Desired == nil || st.Desired.Op != messages.OpDelete {
		t.Fatalf("get as admin: %+v, %v; want the desired record", st, err)
	}

	_ = snapshots.Unsubscribe()

	// Every forbidden operation succeeds for admin (and is undone)...
	done := map[string]bool{}
	for _, role := range []string{"client", "worker", "health", "pools"} {
		for _, o := range forbidden[role] {
			if done[o.name] {
				continue
			}
			done[o.name] = true
			if !o.do(t, admin) || admin.refusedFor(o.subject) {
				t.Fatalf("%s: not done for admin either, so its refusal would prove nothing (refusals %v)", o.name, admin.refusals())
			}
			if o.undo != nil {
				o.undo(t, admin)
			}
		}
	}
	// ... and is refused to the role, on a connection of its own.
	for _, role := range []string{"client", "worker", "health", "pools"} {
		probe := s.connect(role)
		ops := forbidden[role]
		answered := make([]bool, len(ops))
		var wg sync.WaitGroup
		for i, o := range ops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answered[i] = o.do(t, probe)
			}()
		}
		wg.Wait()
		for i, o := range ops {
			t.Run(role+"/"+o.name, func(t *testing.T) {
				if answered[i] {
					t.Errorf("%s: done for %s", o.name, role)
				}
				if !poll.Wait(5*time.Second, func() bool { return probe.refusedFor(o.subject) }) {
					t.Errorf("%s: no refusal of %q reported to %s (refusals: %v)", o.name, o.subject, role, probe.refusals())
				}
			})
		}
	}

	// The fleet still works after all that: the worker recreated the
	// consumers admin deleted, under the worker's permissions.
	clientWork(t, ctx, cl, "p2")

	for _, c := range []*conn{admin, hc, wc, cc, pc} {
		if r := c.refusals(); len(r) > 0 {
			t.Errorf("%s's own work was refused: %v", c.user, r)
		}
	}
}

// banWork asks for a ban as the client user, through a follower of the
// rotation (health, as health, stores it), which another follower, as
// the client user too, then honours; then lifts it. Then the client
// verbs add, list and lift one.
func banWork(t *testing.T, ctx context.Context, s *suite, cl *client.Client, quiet *slog.Logger) {
	t.Helper()
	var rots []*rotation.Rotation
	var conns []*conn
	for range 2 {
		fc := s.connect("client")
		rot, err := rotation.Follow(ctx, fc.nc, rotation.Config{Subjects: subj, Logger: quiet})
		if err != nil {
			t.Fatalf("follow the rotation as client: %v", err)
		}
		defer func() { _ = rot.Close() }()
		rots, conns = append(rots, rot), append(conns, fc)
	}
	if err := rots[0].Ban("203.0.113.7", "www.shop.example", time.Hour); err != nil {
		t.Fatalf("ban as client: %v", err)
	}
	poll.Until(t, "another follower, as client, to honour the ban", 20*time.Second, func() bool {
		return rots[1].Banned(netip.MustParseAddr("203.0.113.7"), "shop.example")
	})
	if err := rots[1].RemoveBan(ctx, "203.0.113.7", "shop.example"); err != nil {
		t.Fatalf("unban as client: %v", err)
	}
	poll.Until(t, "the first follower to see the ban lifted", 20*time.Second, func() bool {
		return !rots[0].Banned(netip.MustParseAddr("203.0.113.7"), "shop.example")
	})

	// The client verbs: ban add, ls and rm.
	b, err := cl.AddBan(ctx, bans.Request{Address: "2001:db8::7", Site: "shop.example", For: messages.Duration(time.Hour), Reason: "captcha"})
	if err != nil {
		t.Fatalf("ban add as client: %v", err)
	}
	poll.Until(t, "a follower to honour the client's ban", 20*time.Second, func() bool {
		return rots[0].Banned(netip.MustParseAddr("2001:db8::7"), "shop.example")
	})
	if got, err := cl.Bans(ctx, client.BanFilter{Site: "shop.example"}); err != nil || len(got) != 1 || got[0] != b {
		t.Fatalf("ban ls as client: %+v %v; want %+v", got, err, b)
	}
	if err := cl.RemoveBan(ctx, "2001:db8::7", "shop.example"); err != nil {
		t.Fatalf("ban rm as client: %v", err)
	}
	poll.Until(t, "a follower to see the client's ban lifted", 20*time.Second, func() bool {
		return !rots[1].Banned(netip.MustParseAddr("2001:db8::7"), "shop.example")
	})
	for _, fc := range conns {
		if r := fc.refusals(); len(r) > 0 {
			t.Errorf("the follower's work was refused: %v", r)
		}
	}
}

// clientWork runs every client verb on id as the client user: create and
// wait, get, list, rotation, hosts, watch, delete and wait.
func clientWork(t *testing.T, ctx context.Context, cl *client.Client, id string) {
	t.Helper()
	o, err := cl.Create(ctx, messages.CreateCommand{ID: id}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("create %s as client: %+v %v", id, o, err)
	}
	if again, err := cl.Create(ctx, messages.CreateCommand{ID: id}, o.CommandID, true); err != nil || !again.Duplicate || again.Final == nil {
		t.Fatalf("create %s again with its command id: %+v %v", id, again, err) // reads PROXY_RESULTS
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a read never waits out a refusal
	st, err := cl.Get(gctx, id)
	cancel()
	if err != nil || st.State() != messages.StateRunning || !st.DesiredUnread || st.Result == nil ||
		st.Result.Outcome != messages.OutcomeDone || !st.Converged() {
		t.Fatalf("get %s as client: %+v %v; want running, converged, its result and no desired record", id, st, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	l, err := cl.List(lctx)
	cancel()
	if err != nil || len(l) != 1 || l[0].ID != id || l[0].State() != messages.StateRunning {
		t.Fatalf("list as client: %+v %v", l, err)
	}
	var rot messages.Rotation
	if !poll.Wait(20*time.Second, func() bool {
		rot, err = cl.Rotation(ctx)
		return err == nil && len(rot.Proxies) == 1 && rot.Proxies[0].ID == id && rot.Proxies[0].Host == "h1"
	}) {
		t.Fatalf("rotation as client: %+v %v (health publishes it)", rot, err)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	hosts, err := cl.Hosts(hctx)
	cancel()
	if err != nil || len(hosts) != 1 || hosts[0].Host != "h1" || hosts[0].Proxies != 1 ||
		hosts[0].MaxProxies != worker.DefaultMaxProxies || hosts[0].State != messages.HostOK {
		t.Fatalf("hosts as client: %+v %v; want h1 holding %s", hosts, err, id)
	}
	var out syncBuffer
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		wt, err := cl.Watch(wctx)
		if err != nil {
			watched <- err
			return
		}
		defer wt.Stop()
		watched <- client.PrintWatch(&out, wt, time.Second, client.WithWatchMode(client.WatchLines))
	}()
	ok := poll.Wait(10*time.Second, func() bool { return strings.Contains(out.String(), " "+id+" running ") })
	stop()
	if err := <-watched; err != nil || !ok {
		t.Fatalf("watch as client: %q, %v", out.String(), err)
	}
	if o, err := cl.Delete(ctx, id, "", true); err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("delete %s as client: %+v %v", id, o, err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// hostWork quarantines and releases host h1 as the client user; a worker,
// as worker, consumes the host commands and writes the host's record.
func hostWork(t *testing.T, ctx context.Context, cl *client.Client) {
	t.Helper()
	o, err := cl.QuarantineHost(ctx, messages.HostCommand{Host: "h1", Reason: "maintenance"}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("host quarantine as client: %+v %v", o, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	hosts, err := cl.Hosts(lctx)
	cancel()
	if err != nil || len(hosts) == 0 || hosts[0].State != messages.HostQuarantined || hosts[0].Reason != "operator: maintenance" {
		t.Fatalf("hosts as client after the quarantine: %+v %v", hosts, err)
	}
	o, err = cl.ReleaseHost(ctx, messages.HostCommand{Host: "h1"}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone || o.Final.Reason != "released" {
		t.Fatalf("host release as client: %+v %v", o, err)
	}
}

// poolWork runs the pool verbs as the client user: set a pool of one and
// wait for it, list it, recycle its member and wait, delete it and wait.
func poolWork(t *testing.T, ctx context.Context, cl *client.Client) {
	t.Helper()
	o, err := cl.PoolSet(ctx, messages.PoolSet{Name: "eu", Size: 1}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool set as client: %+v %v", o, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	pools, err := cl.Pools(lctx)
	cancel()
	if err != nil || len(pools) != 1 || pools[0].Summary.Ready != 1 || pools[0].Record.State != messages.PoolReady {
		t.Fatalf("pool ls as client: %+v %v", pools, err)
	}
	if o, err := cl.PoolRecycle(ctx, messages.PoolRecycle{Name: "eu", All: true}, "", true); err != nil || o.Final == nil ||
		o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool recycle as client: %+v %v", o, err)
	}
	if o, err := cl.PoolDelete(ctx, "eu", "", true); err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool rm as client: %+v %v", o, err)
	}
}
