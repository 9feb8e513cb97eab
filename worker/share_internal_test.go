package worker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

func members(n int, hosts []string) []messages.WorkerRecord {
	out := make([]messages.WorkerRecord, n)
	for i := range out {
		out[i] = messages.WorkerRecord{ID: fmt.Sprintf("host%d-%d", i, 1000+i), State: messages.WorkerActive, Hosts: hosts}
	}
	return out
}

func hostNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d", i+1)
	}
	return out
}

// Every host gets an owner, nobody gets more than ceil(H/W), and every
// worker computes the same assignment whatever the order it read the
// records in.
func TestAssignIsFairAndTheSameForEveryone(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for h := 1; h <= 24; h++ {
		for w := 1; w <= 7; w++ {
			ms := members(w, hostNames(h))
			got := assign(ms)
			if len(got) != h {
				t.Fatalf("H=%d W=%d: %d hosts owned", h, w, len(got))
			}
			load := map[string]int{}
			for _, id := range got {
				load[id]++
			}
			limit := (h + w - 1) / w
			for id, n := range load {
				if n > limit {
					t.Errorf("H=%d W=%d: %s owns %d, more than %d", h, w, id, n, limit)
				}
			}
			shuffled := slices.Clone(ms)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := assign(shuffled); fmt.Sprint(again) != fmt.Sprint(got) {
				t.Fatalf("H=%d W=%d: the order of the records changed the assignment:\n%v\n%v", h, w, got, again)
			}
		}
	}
}

// A host goes only to a worker that can execute it, and none is left
// without an owner when the only workers that can are full.
func TestAssignRespectsWhatEachWorkerExecutes(t *testing.T) {
	ms := []messages.WorkerRecord{
		{ID: "a", Hosts: []string{"h1", "h2", "h3", "h4"}},
		{ID: "b", Hosts: []string{"h1"}},
		{ID: "c"}, // intake only: not counted
	}
	got := assign(ms)
	if len(got) != 4 {
		t.Fatalf("owned: %v", got)
	}
	for h, id := range got {
		if id == "b" && h != "h1" {
			t.Errorf("%s went to b, which cannot execute it", h)
		}
	}
}

// Liveness: an active record younger than the window, stored within the
// bucket's TTL; the worker itself always.
func TestLiveMembers(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	self := messages.WorkerRecord{ID: "me", State: messages.WorkerActive, Hosts: []string{"h1"}}
	rec := func(id, state string, age time.Duration) member {
		return member{rec: messages.WorkerRecord{ID: id, State: state, At: now.Add(-age), Hosts: []string{"h1"}}, stored: now.Add(-age)}
	}
	recs := map[string]member{
		"fresh":    rec("fresh", messages.WorkerActive, time.Second),
		"old":      rec("old", messages.WorkerActive, 6*time.Second),
		"draining": rec("draining", messages.WorkerDraining, 0),
		"me":       rec("me", messages.WorkerDraining, time.Hour), // its own view wins
	}
	ahead := rec("ahead", messages.WorkerActive, -time.Hour) // its writer's clock runs ahead
	ahead.stored = now.Add(-2 * topology.WorkersTTL)
	recs["ahead"] = ahead
	var ids []string
	for _, r := range liveMembers(recs, self, now, 6*time.Second) {
		ids = append(ids, r.ID)
	}
	if want := []string{"fresh", "me"}; !slices.Equal(ids, want) {
		t.Errorf("live: %v, want %v", ids, want)
	}
}
