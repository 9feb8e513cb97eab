package client_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// ClientRolePublish, ClientRoleDeny and ClientRoleSubscribe are the client
// user of deploy/nats/accounts.conf (with the default prefix): everything
// the client verbs need, and no read of PROXY_CMDS or PROXY_DESIRED. Pulls
// from PROXY_EVENTS and PROXY_RESULTS need $JS.API.CONSUMER.MSG.NEXT;
// without it a read is refused, and the refusal reaches only the
// connection's error handler.
var (
	ClientRolePublish = []string{
		"proxy.cmd.create.*", "proxy.cmd.delete.*", "$SYS.REQ.USER.INFO",
		"$JS.API.STREAM.INFO.PROXY_EVENTS", "$JS.API.STREAM.INFO.PROXY_RESULTS", "$JS.API.STREAM.INFO.KV_PROXY_ROTATION",
		"$JS.API.DIRECT.GET.PROXY_EVENTS", "$JS.API.DIRECT.GET.PROXY_EVENTS.>",
		"$JS.API.STREAM.MSG.GET.PROXY_EVENTS", "$JS.API.STREAM.MSG.GET.PROXY_RESULTS",
		"$JS.API.CONSUMER.CREATE.PROXY_EVENTS.>", "$JS.API.CONSUMER.MSG.NEXT.PROXY_EVENTS.*",
		"$JS.API.CONSUMER.INFO.PROXY_EVENTS.*", "$JS.API.CONSUMER.DELETE.PROXY_EVENTS.*",
		"$JS.API.CONSUMER.CREATE.PROXY_RESULTS.>", "$JS.API.CONSUMER.MSG.NEXT.PROXY_RESULTS.*",
		"$JS.API.CONSUMER.DELETE.PROXY_RESULTS.*",
		"$JS.API.CONSUMER.CREATE.KV_PROXY_ROTATION.>", "$JS.API.CONSUMER.DELETE.KV_PROXY_ROTATION.*",
		"$JS.FC.KV_PROXY_ROTATION.>",
		"$JS.API.STREAM.INFO.KV_PROXY_CHECKS", "$JS.API.DIRECT.GET.KV_PROXY_CHECKS.>",
		"$JS.API.CONSUMER.CREATE.KV_PROXY_CHECKS.>", "$JS.API.CONSUMER.DELETE.KV_PROXY_CHECKS.*",
		"$JS.FC.KV_PROXY_CHECKS.>",
		"proxy.rotation.get",
	}
	ClientRoleDeny = []string{
		"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
		"$JS.API.STREAM.PURGE.>", "$JS.API.STREAM.MSG.DELETE.>",
		"$JS.API.CONSUMER.DELETE.PROXY_CMDS.>", "$JS.API.CONSUMER.DELETE.PROXY_WORK.>",
		"$JS.API.STREAM.MSG.GET.PROXY_CMDS", "$JS.API.DIRECT.GET.PROXY_CMDS", "$JS.API.DIRECT.GET.PROXY_CMDS.>",
		"$JS.API.STREAM.MSG.GET.KV_PROXY_DESIRED", "$JS.API.DIRECT.GET.KV_PROXY_DESIRED", "$JS.API.DIRECT.GET.KV_PROXY_DESIRED.>",
		"proxy.rotation", "proxy.rotation.changes",
	}
	ClientRoleSubscribe = []string{"proxy.result.>", "proxy.state.>", "proxy.rotation", "proxy.rotation.changes", "_INBOX_client.>"}
)

// TestClientRolePermissions runs every client verb as a user limited to the
// client role, against a real worker, and fails on any refusal.
func TestClientRolePermissions(t *testing.T) {
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "worker", Password: "w"},
			{Username: "client", Password: "c", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: ClientRolePublish, Deny: ClientRoleDeny},
				Subscribe: &server.SubjectPermission{Allow: ClientRoleSubscribe},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })

	r := &rig{t: t, url: srv.ClientURL(), as: []nats.Option{nats.UserInfo("worker", "w")}}
	r.setUp(true)
	var mu sync.Mutex
	var refused []string
	nc := r.connect(nats.UserInfo("client", "c"), nats.CustomInboxPrefix("_INBOX_client"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		refused = append(refused, err.Error())
		mu.Unlock()
	}))
	c, err := client.New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	r.c = c

	wantFinal(t, r.create("p1", "c1", ""), messages.OutcomeDone)
	if again := r.create("p1", "c1", ""); !again.Duplicate || again.Final == nil {
		t.Fatalf("duplicate: %+v", again) // reads PROXY_RESULTS
	}
	// Reads never wait out a refused request: the client asks the server
	// what it may read, and reads no desired record.
	if st, err := c.Get(ctxFor(t, 5*time.Second), "p1"); err != nil || st.State() != messages.StateRunning ||
		!st.DesiredUnread || st.Desired != nil || st.Result == nil || !st.Converged() {
		t.Fatalf("get: %+v, %v", st, err)
	}
	if l, err := c.List(ctxFor(t, 5*time.Second)); err != nil || len(l) != 1 || l[0].Event == nil || !l[0].DesiredUnread {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if _, err := c.Rotation(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	var buf syncBuffer
	stop := runWatch(t, c, &buf, 50*time.Millisecond)
	waitUntil(t, "watch", func() bool { return strings.Contains(buf.String(), " p1 running ") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantFinal(t, func() client.Outcome {
		o, err := c.Delete(ctxFor(t, 30*time.Second), "p1", "d1", true)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}(), messages.OutcomeDone)

	mu.Lock()
	defer mu.Unlock()
	if len(refused) > 0 {
		t.Fatalf("refused: %v", refused)
	}
}
