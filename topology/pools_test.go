package topology_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// A PROXY_POOLCMDS made anew starts above every sequence PROXY_POOLS
// records, even one the repairer never saw: a pool's later set must not be
// taken for older than the one recorded.
func TestPoolCommandsRecreatedAboveThePoolsSequences(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := ctxFor(t, 30*time.Second)
	topo := topology.Topology{Subjects: subj}
	if _, err := topo.Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, messages.BucketPools)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "eu", []byte(`{"v":1,"name":"eu","op":"set","seq":5000}`)); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, messages.StreamPoolCommands); err != nil {
		t.Fatal(err)
	}
	startRepairer(t, js, 50*time.Millisecond)
	var info *jetstream.StreamInfo
	poll.Until(t, messages.StreamPoolCommands+" back", 10*time.Second, func() bool {
		st, err := js.Stream(ctx, messages.StreamPoolCommands)
		if err == nil {
			info = st.CachedInfo()
		}
		return err == nil
	})
	if info.State.FirstSeq != 5000+topology.FirstSeqMargin {
		t.Fatalf("recreated %s starts at %d, want above 5000 (+ margin)", messages.StreamPoolCommands, info.State.FirstSeq)
	}
	if got := info.Config.Subjects; len(got) != 1 || got[0] != "proxy.cmd.pool.>" {
		t.Fatalf("subjects %v", got)
	}
}
