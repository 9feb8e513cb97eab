package pool

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/messages"
)

// metrics is the controller's collector. Gauges are read from the view of
// the pools and the rotation at scrape time (every controller exports
// them alike); counters count what this process did. The pool's name is
// a label: pools are few, and a deleted pool's series go with it.
type metrics struct {
	c *Controller

	mu       sync.Mutex
	creates  map[string]float64    // by pool
	deletes  map[[2]string]float64 // by pool, why
	failures map[string]float64    // by pool
	recycles map[[2]string]float64 // by pool, cause
	commands map[[2]string]float64 // by op, outcome
}

var (
	descActive    = prometheus.NewDesc("proxyfleet_pool_active", "1 while this controller holds the pools' lease (runs the passes), else 0.", nil, nil)
	descSize      = prometheus.NewDesc("proxyfleet_pool_size", "A pool's size: the members it keeps in the rotation.", []string{"pool"}, nil)
	descMembers   = prometheus.NewDesc("proxyfleet_pool_members", "A pool's members by state: ready (in the rotation), creating (never in it yet), recycling (due for replacement), retiring (being deleted).", []string{"pool", "state"}, nil)
	descDegraded  = prometheus.NewDesc("proxyfleet_pool_degraded", "1 while a pool is degraded (its creations keep failing, or no host has room), else 0.", []string{"pool"}, nil)
	descOldest    = prometheus.NewDesc("proxyfleet_pool_oldest_age_seconds", "Age of a pool's oldest live member.", []string{"pool"}, nil)
	descCreates   = prometheus.NewDesc("proxyfleet_pool_creates_total", "Creates of pool members this controller published.", []string{"pool"}, nil)
	descDeletes   = prometheus.NewDesc("proxyfleet_pool_deletes_total", "Deletes of pool members this controller published, by why: broken, recycle, shrink, delete.", []string{"pool", "why"}, nil)
	descFailures  = prometheus.NewDesc("proxyfleet_pool_failures_total", "Pool members this controller found broken (failed, or out of the rotation for ready_timeout).", []string{"pool"}, nil)
	descCommands  = prometheus.NewDesc("proxyfleet_pool_commands_total", "Answers to pool commands, by op and outcome.", []string{"op", "outcome"}, nil)
	descRecycles  = prometheus.NewDesc("proxyfleet_pool_recycles_total", "Pool members this controller retired once a replacement filled their place, by cause: command (pool recycle), bans (banned on recycle_after_bans sites), spec, hosts, age (max_age).", []string{"pool", "cause"}, nil)
	allPoolDescs  = []*prometheus.Desc{descActive, descSize, descMembers, descDegraded, descOldest, descCreates, descDeletes, descFailures, descCommands, descRecycles}
	memberStates  = []string{"ready", "creating", "recycling", "retiring"}
	poolDeleteWhy = []string{messages.RetireBroken, messages.RetireRecycle, messages.RetireShrink, messages.RetireDelete}
)

func newMetrics(c *Controller) *metrics {
	return &metrics{c: c, creates: map[string]float64{}, deletes: map[[2]string]float64{}, failures: map[string]float64{},
		recycles: map[[2]string]float64{}, commands: map[[2]string]float64{}}
}

func (m *metrics) created(pool string) {
	m.mu.Lock()
	m.creates[pool]++
	m.mu.Unlock()
}

func (m *metrics) deleted(pool, why string) {
	m.mu.Lock()
	m.deletes[[2]string{pool, why}]++
	m.mu.Unlock()
}

func (m *metrics) failed(pool string) {
	m.mu.Lock()
	m.failures[pool]++
	m.mu.Unlock()
}

func (m *metrics) recycled(pool, cause string) {
	m.mu.Lock()
	m.recycles[[2]string{pool, cause}]++
	m.mu.Unlock()
}

func (m *metrics) answered(op, outcome string) {
	m.mu.Lock()
	m.commands[[2]string{op, outcome}]++
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allPoolDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	c := m.c
	active := 0.0
	if c.Active() {
		active = 1
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active)
	now := c.cfg.Now()
	pools := map[string]bool{}
	for _, e := range c.snapshot() {
		r := e.rec
		pools[r.Name] = true
		s := r.Summary(now, func(id string) bool { _, ok := c.rot.Get(id); return ok })
		ch <- prometheus.MustNewConstMetric(descSize, prometheus.GaugeValue, float64(r.Size), r.Name)
		for i, v := range []int{s.Ready, s.Creating, s.Recycling, s.Retiring} {
			ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(v), r.Name, memberStates[i])
		}
		degraded := 0.0
		if r.State == messages.PoolDegraded {
			degraded = 1
		}
		ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, degraded, r.Name)
		oldest := 0.0
		if !s.Oldest.IsZero() {
			oldest = now.Sub(s.Oldest).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, oldest, r.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range pools {
		ch <- prometheus.MustNewConstMetric(descCreates, prometheus.CounterValue, m.creates[p], p)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, m.failures[p], p)
		for _, why := range poolDeleteWhy {
			ch <- prometheus.MustNewConstMetric(descDeletes, prometheus.CounterValue, m.deletes[[2]string{p, why}], p, why)
		}
		for _, cause := range messages.RecycleCauses {
			ch <- prometheus.MustNewConstMetric(descRecycles, prometheus.CounterValue, m.recycles[[2]string{p, cause}], p, cause)
		}
	}
	// A deleted pool's counters go with it.
	for p := range m.creates {
		if !pools[p] {
			delete(m.creates, p)
		}
	}
	for p := range m.failures {
		if !pools[p] {
			delete(m.failures, p)
		}
	}
	for k := range m.deletes {
		if !pools[k[0]] {
			delete(m.deletes, k)
		}
	}
	for k := range m.recycles {
		if !pools[k[0]] {
			delete(m.recycles, k)
		}
	}
	for k, v := range m.commands {
		ch <- prometheus.MustNewConstMetric(descCommands, prometheus.CounterValue, v, k[0], k[1])
	}
}
