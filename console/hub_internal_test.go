package console

import (
	"testing"

	"proxyfleet/client"
)

// A subscriber gets the held events after its position, is told to read
// afresh when events after it are no longer held, and is dropped (its
// channel closed) when it falls a whole buffer behind.
func TestHubSubscribe(t *testing.T) {
	h := newHub(nil, nil)
	h.size = 3
	if _, _, st := h.subscribe(0); st != notYet {
		t.Fatalf("before the watch is open: %v, want notYet", st)
	}
	h.watched = true
	for seq := uint64(1); seq <= 5; seq++ {
		h.publish(client.Update{StreamSeq: seq})
	}
	// Held: 3, 4, 5.
	if _, _, st := h.subscribe(1); st != tooOld {
		t.Fatalf("position 1: %v; event 2 is no longer held, want tooOld", st)
	}
	back, ch, st := h.subscribe(2)
	if st != subscribed || len(back) != 3 || back[0].StreamSeq != 3 {
		t.Fatalf("position 2: %v %v", back, st)
	}
	back2, ch2, st := h.subscribe(5)
	if st != subscribed || len(back2) != 0 {
		t.Fatalf("position 5: %v %v", back2, st)
	}
	h.unsubscribe(ch2)
	for i := range subscriberBuffer + 1 {
		h.publish(client.Update{StreamSeq: uint64(6 + i)})
	}
	n := 0
	for range ch {
		n++
	}
	if n != subscriberBuffer {
		t.Fatalf("a dropped subscriber got %d events, want %d then the close", n, subscriberBuffer)
	}
	h.unsubscribe(ch) // after the drop: nothing to do
}
