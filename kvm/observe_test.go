package kvm

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// recObserver records what a link tells its observer.
type recObserver struct {
	mu                       sync.Mutex
	calls                    map[string]int // "proc" or "proc!" when failed
	dialsOK, dialsErr, death int
	overruns                 int
	bytes                    int64
}

func newRecObserver() *recObserver { return &recObserver{calls: map[string]int{}} }

func (r *recObserver) Call(p string, d time.Duration, failed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d <= 0 {
		p += "?" // a duration that cannot be
	}
	if failed {
		p += "!"
	}
	r.calls[p]++
}

func (r *recObserver) Dial(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.dialsErr++
	} else {
		r.dialsOK++
	}
}

func (r *recObserver) Death(error) { r.mu.Lock(); r.death++; r.mu.Unlock() }
func (r *recObserver) Overrun()    { r.mu.Lock(); r.overruns++; r.mu.Unlock() }
func (r *recObserver) ImageBytes(n int64) {
	r.mu.Lock()
	r.bytes += n
	r.mu.Unlock()
}

func (r *recObserver) snapshot() (calls map[string]int, ok, bad, deaths, overruns int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls = map[string]int{}
	for k, v := range r.calls {
		calls[k] = v
	}
	return calls, r.dialsOK, r.dialsErr, r.death, r.overruns
}

func packet(program, proc, typ, serial, status uint32, payload int) []byte {
	b := make([]byte, rpcHeaderLen+payload)
	for i, v := range []uint32{uint32(len(b)), program, 1, proc, typ, serial, status} {
		binary.BigEndian.PutUint32(b[4*i:], v)
	}
	for i := rpcHeaderLen; i < len(b); i++ {
		b[i] = 0xff // payload bytes that would read as a huge length if taken for a header
	}
	return b
}

// The framer finds every header whatever the sizes of the writes.
func TestFramer_headersThroughAnyChunking(t *testing.T) {
	var stream []byte
	want := []rpcHeader{}
	for i, p := range []struct{ proc, typ, status uint32 }{{23, 0, 0}, {23, 1, 1}, {208, 3, 2}, {273, 0, 0}} {
		pl := (i * 37) % 100
		stream = append(stream, packet(rpcRemoteProgram, p.proc, p.typ, uint32(i+1), p.status, pl)...)
		want = append(want, rpcHeader{length: uint32(rpcHeaderLen + pl), program: rpcRemoteProgram, procedure: p.proc, typ: p.typ, serial: uint32(i + 1), status: p.status})
	}
	for _, chunk := range []int{1, 3, 7, 28, 29, 64, len(stream)} {
		var got []rpcHeader
		f := framer{on: func(h rpcHeader) { got = append(got, h) }}
		for p := stream; len(p) > 0; {
			n := min(chunk, len(p))
			f.feed(p[:n])
			p = p[n:]
		}
		if len(got) != len(want) {
			t.Fatalf("chunks of %d: %d headers, want %d: %+v", chunk, len(got), len(want), got)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("chunks of %d: header %d = %+v, want %+v", chunk, i, got[i], want[i])
			}
		}
	}
	// A length that cannot be stops the framer instead of misreading.
	var got int
	f := framer{on: func(rpcHeader) { got++ }}
	f.feed(make([]byte, 4)) // a length of 0
	f.feed(make([]byte, 24))
	f.feed(packet(rpcRemoteProgram, 1, 0, 2, 0, 0))
	if got != 0 || !f.lost {
		t.Fatalf("after a zero length: %d headers, lost %v; want 0, true", got, f.lost)
	}
}

// procNames agrees with go-libvirt's own table of remote procedures.
func TestProcNames_matchGoLibvirt(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/digitalocean/go-libvirt").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	f, err := os.Open(filepath.Join(strings.TrimSpace(string(out)), "internal", "constants", "remote_protocol.gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s+Proc([A-Za-z0-9]+) = (\d+)$`)
	byNum := map[uint32]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[2])
			byNum[uint32(n)] = m[1]
		}
	}
	if len(byNum) < 300 {
		t.Fatalf("read %d procedures from go-libvirt, want its whole table", len(byNum))
	}
	for n, name := range procNames {
		if byNum[n] != name {
			t.Errorf("procedure %d is %q in go-libvirt, %q here", n, byNum[n], name)
		}
	}
}

// A link tells its observer of its dials, every call by procedure (a
// daemon's error as failed), an overrun and the death it causes, and
// nothing of a Close.
func TestLink_observer(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	obs := newRecObserver()
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, p.Addr()), Observer: obs})
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatal(err)
	}
	err := k.call(context.Background(), 5*time.Second, func(l *libvirt.Libvirt) error {
		_, err := l.DomainLookupByName("pf-no-such-domain-observed")
		return err
	})
	if fleet.ClassOf(err) != fleet.ClassNotFound {
		t.Fatalf("lookup of a missing domain = %v, want not-found", err)
	}
	calls, ok, bad, deaths, overruns := obs.snapshot()
	if ok != 1 || bad != 0 || deaths != 0 || overruns != 0 {
		t.Fatalf("after two calls: dials %d ok %d failed, %d deaths, %d overruns; want 1, 0, 0, 0", ok, bad, deaths, overruns)
	}
	for _, want := range []string{"ConnectOpen", "ConnectGetLibVersion", "DomainLookupByName!"} {
		if calls[want] != 1 {
			t.Errorf("calls %v: want one %s", calls, want)
		}
	}

	err = k.call(context.Background(), time.Second, func(l *libvirt.Libvirt) error {
		p.Stall()
		return version(l)
	})
	if !errors.Is(err, ErrLinkDead) {
		t.Fatalf("stalled call = %v, want ErrLinkDead", err)
	}
	p.Pass()
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the overrun: %v", err)
	}
	calls, ok, _, deaths, overruns = obs.snapshot()
	if overruns != 1 || deaths != 1 || ok != 2 {
		t.Fatalf("after an overrun and a redial: %d overruns, %d deaths, %d dials; want 1, 1, 2", overruns, deaths, ok)
	}
	if calls["ConnectGetLibVersion"] != 2 {
		t.Errorf("calls %v: want two ConnectGetLibVersion answered (the stalled one is never answered)", calls)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, deaths, _ = obs.snapshot(); deaths != 1 {
		t.Fatalf("Close counted as a death: %d deaths", deaths)
	}
}
