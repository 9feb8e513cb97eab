package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Pools: a client asks for "size proxies of this spec, each at most
// max_age old" and the pool controller keeps them by publishing ordinary
// create and delete commands. See docs/ARCHITECTURE.md, "Pools".

// Stream and bucket of the pools.
const (
	// StreamPoolCommands is a work queue over <prefix>.cmd.pool.>: pool
	// commands, consumed by the pool controllers (intake consumes every
	// command of PROXY_CMDS, so pool commands have a stream of their own).
	StreamPoolCommands = "PROXY_POOLCMDS"
	// BucketPools holds one PoolRecord per pool (key = pool name).
	BucketPools = "PROXY_POOLS"
)

// Pool operations: the op of a pool command's results.
const (
	OpPoolSet     = "pool.set"
	OpPoolDelete  = "pool.delete"
	OpPoolRecycle = "pool.recycle"
)

// The subject tokens of pool commands: <prefix>.cmd.pool.<token>.<name>.
const (
	poolSetToken     = "set"
	poolDeleteToken  = "delete"
	poolRecycleToken = "recycle"
)

// Pool limits and defaults.
const (
	// PoolSuffixLen is the length of the random part of a member's id,
	// <pool>-<suffix>.
	PoolSuffixLen = 6
	// MaxPoolName leaves room for "-<suffix>" in a member id (ids are at
	// most 63 characters).
	MaxPoolName = 63 - 1 - PoolSuffixLen
	// MaxPoolSize bounds a pool's size: a pool is one record, written with
	// compare-and-set, which holds every member.
	MaxPoolSize  = 1000
	MaxPoolSurge = 100
	// MaxPoolHosts bounds spec.hosts, MaxPoolRecycleIDs the ids of one
	// recycle.
	MaxPoolHosts      = 256
	MaxPoolRecycleIDs = MaxPoolSize + MaxPoolSurge

	DefaultPoolSurge        = 1
	DefaultPoolReadyTimeout = 5 * time.Minute
	MinPoolReadyTimeout     = time.Second
	MaxPoolReadyTimeout     = 24 * time.Hour
	MinPoolMaxAge           = time.Second
	// PoolJitter is the largest share of max_age taken off a member's
	// deadline (each member draws its own), so a pool made at once does
	// not turn over at once.
	PoolJitter = 0.1
	// PoolLabel is the label every member carries, with the pool's name.
	PoolLabel = "pool"
	// MaxPoolRecycleAfterBans bounds recycle_after_bans.
	MaxPoolRecycleAfterBans = 1000
)

// Duration is a time.Duration that travels as a Go duration string
// ("6h", "90s").
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON encodes d as "1h0m0s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON decodes a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"6h\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// PoolSpec is what every member of a pool is made of: the fields of a
// create command, and the hosts the members may go to (any host when
// empty).
type PoolSpec struct {
	Image     string            `json:"image,omitempty"`
	CPUs      int               `json:"cpus,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Hosts     []string          `json:"hosts,omitempty"`
}

// PoolSet is published on <prefix>.cmd.pool.set.<name>: it creates the
// pool or replaces its whole spec (an absent field takes its default, not
// the value a previous set gave it).
type PoolSet struct {
	V    int    `json:"v"`
	Name string `json:"name"`
	Size int    `json:"size"`
	// MinReady: recycling never takes the pool's members in the rotation
	// below it (default: size).
	MinReady *int `json:"min_ready,omitempty"`
	// Surge: members made beyond size at once to replace old ones
	// (default 1).
	Surge *int `json:"surge,omitempty"`
	// MaxAge: a member older than it (less up to 10% jitter) is replaced;
	// 0 or absent: never.
	MaxAge Duration `json:"max_age,omitempty"`
	// ReadyTimeout: a member not in the rotation for this long (since it
	// was made, or since it left) is deleted and replaced (default 5m).
	ReadyTimeout Duration `json:"ready_timeout,omitempty"`
	// RecycleAfterBans: a member whose egress addresses are banned on
	// this many sites at once is replaced, make-before-break; 0 or
	// absent: never.
	RecycleAfterBans int      `json:"recycle_after_bans,omitempty"`
	Spec             PoolSpec `json:"spec,omitzero"`
}

// PoolDelete is published on <prefix>.cmd.pool.delete.<name>: every member
// is deleted, then the pool's record.
type PoolDelete struct {
	V    int    `json:"v"`
	Name string `json:"name"`
}

// PoolRecycle is published on <prefix>.cmd.pool.recycle.<name>: the members
// named (or all) are replaced as old ones are, make-before-break.
type PoolRecycle struct {
	V    int      `json:"v"`
	Name string   `json:"name"`
	IDs  []string `json:"ids,omitempty"`
	All  bool     `json:"all,omitempty"`
}

// ValidPoolName reports whether name can name a pool: an id short enough
// to leave room for a member's suffix.
func ValidPoolName(name string) bool { return len(name) <= MaxPoolName && ValidID(name) }

func checkPoolName(v int, name, subjectName string) error {
	if v != Version {
		return fieldErr("v", "version %d is not supported, want %d", v, Version)
	}
	if name == "" {
		return fieldErr("name", "missing")
	}
	if !ValidPoolName(name) {
		return fieldErr("name", "%q is not a valid pool name (lowercase letters, digits and '-', at most %d, starting and ending with a letter or digit)", truncate(name), MaxPoolName)
	}
	if subjectName != name {
		return fieldErr("name", "body name %q does not match the subject's %q", name, truncate(subjectName))
	}
	return nil
}

// DecodePoolSet decodes and validates a pool set published with
// subjectName as the subject's name token. Absent optional fields stay
// absent (nil, 0): Resolved fills the defaults.
func DecodePoolSet(body []byte, subjectName string) (PoolSet, error) {
	var w struct {
		V            int             `json:"v"`
		Name         string          `json:"name"`
		Size         *int            `json:"size"`
		MinReady     *int            `json:"min_ready"`
		Surge        *int            `json:"surge"`
		MaxAge       *string         `json:"max_age"`
		ReadyTimeout *string         `json:"ready_timeout"`
		Recycle      *int            `json:"recycle_after_bans"`
		Spec         json.RawMessage `json:"spec"`
	}
	if err := decodeStrict(body, &w); err != nil {
		return PoolSet{}, err
	}
	p := PoolSet{V: w.V, Name: w.Name, MinReady: w.MinReady, Surge: w.Surge}
	if err := checkPoolName(p.V, p.Name, subjectName); err != nil {
		return p, err
	}
	if w.Size == nil {
		return p, fieldErr("size", "missing")
	}
	p.Size = *w.Size
	if w.Recycle != nil {
		p.RecycleAfterBans = *w.Recycle
	}
	for _, d := range []struct {
		field string
		in    *string
		out   *Duration
	}{{"max_age", w.MaxAge, &p.MaxAge}, {"ready_timeout", w.ReadyTimeout, &p.ReadyTimeout}} {
		if d.in == nil {
			continue
		}
		v, err := time.ParseDuration(*d.in)
		if err != nil {
			return p, fieldErr(d.field, "%q is not a duration (such as \"6h\" or \"90s\")", truncate(*d.in))
		}
		*d.out = Duration(v)
	}
	if w.ReadyTimeout != nil && p.ReadyTimeout == 0 {
		return p, fieldErr("ready_timeout", "0 is out of range [%s, %s]", MinPoolReadyTimeout, MaxPoolReadyTimeout)
	}
	if len(w.Spec) > 0 && !bytes.Equal(bytes.TrimSpace(w.Spec), []byte("null")) {
		if err := decodeStrict(w.Spec, &p.Spec); err != nil {
			return p, nestField("spec", err)
		}
	}
	return p, p.Validate(subjectName)
}

// nestField names a field error of a nested object by its path.
func nestField(prefix string, err error) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	if fe.Field == "body" {
		return fieldErr(prefix, "%s", fe.Reason)
	}
	return fieldErr(prefix+"."+fe.Field, "%s", fe.Reason)
}

// Validate checks everything about p that needs no configuration (image
// and host names are checked for existence by the controller).
func (p PoolSet) Validate(subjectName string) error {
	if err := checkPoolName(p.V, p.Name, subjectName); err != nil {
		return err
	}
	if p.Size < 0 || p.Size > MaxPoolSize {
		return fieldErr("size", "%d is out of range [0, %d]", p.Size, MaxPoolSize)
	}
	if p.MinReady != nil && (*p.MinReady < 0 || *p.MinReady > p.Size) {
		return fieldErr("min_ready", "%d is out of range [0, size %d]", *p.MinReady, p.Size)
	}
	if p.Surge != nil && (*p.Surge < 1 || *p.Surge > MaxPoolSurge) {
		return fieldErr("surge", "%d is out of range [1, %d]", *p.Surge, MaxPoolSurge)
	}
	if a := p.MaxAge.D(); a != 0 && a < MinPoolMaxAge {
		return fieldErr("max_age", "%s is out of range: 0 (never) or at least %s", a, MinPoolMaxAge)
	}
	if r := p.ReadyTimeout.D(); r != 0 && (r < MinPoolReadyTimeout || r > MaxPoolReadyTimeout) {
		return fieldErr("ready_timeout", "%s is out of range [%s, %s]", r, MinPoolReadyTimeout, MaxPoolReadyTimeout)
	}
	if n := p.RecycleAfterBans; n < 0 || n > MaxPoolRecycleAfterBans {
		return fieldErr("recycle_after_bans", "%d is out of range: 0 (never) to %d", n, MaxPoolRecycleAfterBans)
	}
	return p.Spec.validate()
}

func (s PoolSpec) validate() error {
	c := CreateCommand{Image: s.Image, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB}
	if c.Image != "" && !ValidID(c.Image) {
		return fieldErr("spec.image", "%q is not a valid image name", truncate(c.Image))
	}
	if c.CPUs != 0 && (c.CPUs < MinCPUs || c.CPUs > MaxCPUs) {
		return fieldErr("spec.cpus", "%d is out of range [%d, %d]", c.CPUs, MinCPUs, MaxCPUs)
	}
	if c.MemoryMiB != 0 && (c.MemoryMiB < MinMemoryMiB || c.MemoryMiB > MaxMemoryMiB) {
		return fieldErr("spec.memory_mib", "%d is out of range [%d, %d]", c.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	}
	if _, ok := s.Labels[PoolLabel]; ok {
		return fieldErr("spec.labels", "key %q is the pool's own: every member carries %s=<name>", PoolLabel, PoolLabel)
	}
	if len(s.Labels) >= MaxLabels {
		return fieldErr("spec.labels", "%d labels, at most %d (one more is the pool's)", len(s.Labels), MaxLabels-1)
	}
	for k, v := range s.Labels {
		if !labelKeyRE.MatchString(k) {
			return fieldErr("spec.labels", "key %q is not a valid label key", truncate(k))
		}
		if len(v) > 255 {
			return fieldErr("spec.labels", "value of %q is longer than 255 bytes", k)
		}
	}
	if len(s.Hosts) > MaxPoolHosts {
		return fieldErr("spec.hosts", "%d hosts, at most %d", len(s.Hosts), MaxPoolHosts)
	}
	seen := map[string]bool{}
	for _, h := range s.Hosts {
		if !ValidID(h) {
			return fieldErr("spec.hosts", "%q is not a valid host name", truncate(h))
		}
		if seen[h] {
			return fieldErr("spec.hosts", "%q is named twice", h)
		}
		seen[h] = true
	}
	return nil
}

// DecodePoolDelete decodes and validates a pool delete.
func DecodePoolDelete(body []byte, subjectName string) (PoolDelete, error) {
	var d PoolDelete
	if err := decodeStrict(body, &d); err != nil {
		return PoolDelete{}, err
	}
	return d, checkPoolName(d.V, d.Name, subjectName)
}

// DecodePoolRecycle decodes and validates a pool recycle: ids or all, not
// both, not neither.
func DecodePoolRecycle(body []byte, subjectName string) (PoolRecycle, error) {
	var r PoolRecycle
	if err := decodeStrict(body, &r); err != nil {
		return PoolRecycle{}, err
	}
	if err := checkPoolName(r.V, r.Name, subjectName); err != nil {
		return r, err
	}
	switch {
	case r.All && len(r.IDs) > 0:
		return r, fieldErr("ids", "ids and all exclude each other")
	case !r.All && len(r.IDs) == 0:
		return r, fieldErr("ids", "missing: name the members to recycle, or set all")
	case len(r.IDs) > MaxPoolRecycleIDs:
		return r, fieldErr("ids", "%d ids, at most %d", len(r.IDs), MaxPoolRecycleIDs)
	}
	for _, id := range r.IDs {
		if !ValidID(id) {
			return r, fieldErr("ids", "%q is not a valid proxy id", truncate(id))
		}
	}
	return r, nil
}

// Resolved returns p's settings with their defaults filled in.
func (p PoolSet) Resolved() (minReady, surge int, readyTimeout time.Duration) {
	minReady, surge, readyTimeout = p.Size, DefaultPoolSurge, DefaultPoolReadyTimeout
	if p.MinReady != nil {
		minReady = *p.MinReady
	}
	if p.Surge != nil {
		surge = *p.Surge
	}
	if p.ReadyTimeout != 0 {
		readyTimeout = p.ReadyTimeout.D()
	}
	return minReady, surge, readyTimeout
}

// Subjects of the pools.

// PoolSet is <prefix>.cmd.pool.set.<name>.
func (s Subjects) PoolSet(name string) string { return s.join("cmd", "pool", poolSetToken, name) }

// PoolDelete is <prefix>.cmd.pool.delete.<name>.
func (s Subjects) PoolDelete(name string) string { return s.join("cmd", "pool", poolDeleteToken, name) }

// PoolRecycle is <prefix>.cmd.pool.recycle.<name>.
func (s Subjects) PoolRecycle(name string) string {
	return s.join("cmd", "pool", poolRecycleToken, name)
}

// PoolCommand is the subject of pool op (OpPoolSet, OpPoolDelete,
// OpPoolRecycle) for name.
func (s Subjects) PoolCommand(op, name string) string {
	switch op {
	case OpPoolSet:
		return s.PoolSet(name)
	case OpPoolDelete:
		return s.PoolDelete(name)
	default:
		return s.PoolRecycle(name)
	}
}

// PoolCommandAll matches every pool command (the stream's subject).
func (s Subjects) PoolCommandAll() string { return s.join("cmd", "pool", ">") }

// PoolResult is <prefix>.result.pool.<name>, where a pool command is
// answered (PROXY_RESULTS keeps it, as every result.>).
func (s Subjects) PoolResult(name string) string { return s.join("result", "pool", name) }

// ResultProxies matches the results of proxy commands only (one token
// after result), not those of pools.
func (s Subjects) ResultProxies() string { return s.join("result", "*") }

// ParsePoolCommand splits <prefix>.cmd.pool.<op>.<name> into the op
// (OpPoolSet, ...) and the name token, unvalidated.
func (s Subjects) ParsePoolCommand(subject string) (op, name string, err error) {
	return s.parseCommand(subject, "pool", "<name>", [][2]string{{poolSetToken, OpPoolSet}, {poolDeleteToken, OpPoolDelete}, {poolRecycleToken, OpPoolRecycle}})
}

// parseCommand splits <prefix>.cmd.<kind>.<token>.<name> into the op of
// the token (ops: pairs of token and op) and the name token,
// unvalidated; what names the name in the error.
func (s Subjects) parseCommand(subject, kind, what string, ops [][2]string) (op, name string, err error) {
	rest, ok := strings.CutPrefix(subject, s.Prefix+".cmd."+kind+".")
	if ok {
		var tok string
		tok, name, ok = strings.Cut(rest, ".")
		ok = ok && name != "" && !strings.Contains(name, ".")
		i := slices.IndexFunc(ops, func(o [2]string) bool { return o[0] == tok })
		if ok = ok && i >= 0; ok {
			op = ops[i][1]
		}
	}
	if !ok {
		toks := make([]string, len(ops))
		for i, o := range ops {
			toks[i] = o[0]
		}
		return "", "", fmt.Errorf("subject %q: want %s.cmd.%s.{%s}.%s", subject, s.Prefix, kind, strings.Join(toks, ","), what)
	}
	return op, name, nil
}
