package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// guestCPU samples the CPU time of the qemu processes of guests whose
// names start with a prefix (qemu runs on this machine's kernel, in the
// test host's namespace), to measure what the guests' own boots cost: the
// bound no control plane can go below on this many cores.
type guestCPU struct {
	prefixes []string
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	ticks    map[int]uint64 // pid -> the last utime+stime seen
}

const clockTicks = 100 // USER_HZ on Linux

func sampleGuestCPU(prefixes ...string) *guestCPU {
	g := &guestCPU{prefixes: prefixes, stop: make(chan struct{}), done: make(chan struct{}), ticks: map[int]uint64{}}
	go func() {
		defer close(g.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			g.sample()
			select {
			case <-g.stop:
				return
			case <-t.C:
			}
		}
	}()
	return g
}

// seconds stops the sampling and returns the CPU seconds seen in all.
func (g *guestCPU) seconds() float64 {
	close(g.stop)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	var sum uint64
	for _, t := range g.ticks {
		sum += t
	}
	return float64(sum) / clockTicks
}

func (g *guestCPU) sample() {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil || !bytes.HasPrefix(cmd, []byte("/usr/bin/qemu")) && !bytes.Contains(cmd, []byte("qemu-system")) {
			continue
		}
		if !g.ours(cmd) {
			continue
		}
		t, ok := procTicks(pid)
		if !ok {
			continue
		}
		g.mu.Lock()
		g.ticks[pid] = max(g.ticks[pid], t)
		g.mu.Unlock()
	}
}

// procTicks is the CPU time (utime+stime, clock ticks) process pid has
// used.
func procTicks(pid int) (uint64, bool) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command's closing parenthesis: state is the 3rd
	// field of the line, utime and stime the 14th and 15th.
	i := bytes.LastIndexByte(st, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(st[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return u + s, true
}

// ours: the qemu command line names one of the guests (-name guest=NAME,…).
func (g *guestCPU) ours(cmd []byte) bool {
	for _, a := range bytes.Split(cmd, []byte{0}) {
		if v, ok := bytes.CutPrefix(a, []byte("guest=")); ok {
			for _, p := range g.prefixes {
				if bytes.HasPrefix(v, []byte(p)) {
					return true
				}
			}
		}
	}
	return false
}
