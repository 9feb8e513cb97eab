package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Seed is what the guest read from its NoCloud seed.
type Seed struct {
	Source      string // the device it was read from
	MetaDataRaw []byte
	UserData    []byte
	// NetworkConfig is the seed's network-config file (nil: none, the
	// guest takes a DHCP lease).
	NetworkConfig []byte
	InstanceID    string
	LocalHostname string
	Meta          map[string]string
}

// ParseMetaData reads NoCloud meta-data: either a JSON object or the simple
// YAML mapping cloud-init writers produce ("key: value" lines, optionally
// quoted). Nested values are ignored; only top-level scalars are kept.
func ParseMetaData(b []byte) (map[string]string, error) {
	s := strings.TrimSpace(strings.TrimPrefix(string(b), "\ufeff"))
	out := map[string]string{}
	if strings.HasPrefix(s, "{") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			return nil, fmt.Errorf("meta-data: %w", err)
		}
		for k, v := range m {
			switch v := v.(type) {
			case string:
				out[k] = v
			case float64, bool:
				out[k] = fmt.Sprint(v)
			}
		}
		return out, nil
	}
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimRight(line, "\r")
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") || t == "---" || t == "..." {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' || strings.HasPrefix(t, "- ") {
			continue // nested content
		}
		k, v, ok := strings.Cut(t, ":")
		if !ok {
			return nil, fmt.Errorf("meta-data line %d: no key", i+1)
		}
		k = strings.TrimSpace(k)
		v = strings.TrimSpace(v)
		v = unquoteYAML(v)
		out[unquoteYAML(k)] = v
	}
	return out, nil
}

func unquoteYAML(v string) string {
	if v == "" {
		return v
	}
	switch v[0] {
	case '"':
		for i := 1; i < len(v); i++ {
			if v[i] == '\\' {
				i++
				continue
			}
			if v[i] == '"' {
				var s string
				if err := json.Unmarshal([]byte(v[:i+1]), &s); err == nil {
					return s
				}
				return v[1:i]
			}
		}
		return v
	case '\'':
		for i := 1; i < len(v); i++ {
			if v[i] == '\'' {
				if i+1 < len(v) && v[i+1] == '\'' {
					i++
					continue
				}
				return strings.ReplaceAll(v[1:i], "''", "'")
			}
		}
		return v
	}
	// A plain scalar: drop a trailing comment.
	if i := strings.Index(v, " #"); i >= 0 {
		v = strings.TrimSpace(v[:i])
	}
	return v
}

// seedFile returns the path of name in dir, also accepting the forms a plain
// ISO9660 writer may leave: another case, '_' for '-', a ";1" version suffix.
func seedFile(dir, name string) string {
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return p
	}
	for _, e := range ents {
		n := strings.ToLower(e.Name())
		n = strings.TrimSuffix(n, ";1")
		n = strings.TrimSuffix(n, ".")
		n = strings.ReplaceAll(n, "_", "-")
		if n == name && !e.IsDir() {
			return filepath.Join(dir, e.Name())
		}
	}
	return p
}

// ReadSeedDir reads meta-data (required), user-data and network-config
// (optional) from dir.
func ReadSeedDir(dir string) (*Seed, error) {
	md, err := os.ReadFile(seedFile(dir, "meta-data"))
	if err != nil {
		return nil, err
	}
	meta, err := ParseMetaData(md)
	if err != nil {
		return nil, err
	}
	ud, err := os.ReadFile(seedFile(dir, "user-data"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	nc, err := os.ReadFile(seedFile(dir, "network-config"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	s := &Seed{MetaDataRaw: md, UserData: ud, NetworkConfig: nc, Meta: meta, InstanceID: meta["instance-id"], LocalHostname: meta["local-hostname"]}
	if s.InstanceID == "" {
		return nil, errors.New("meta-data has no instance-id")
	}
	return s, nil
}

// CandidateDisks lists block devices that may hold the seed: virtio disks
// first, then CD-ROMs, in name order.
func CandidateDisks(devRoot string) []string {
	var out []string
	for _, pat := range []string{"vd[a-z]", "vd[a-z][a-z]", "sr[0-9]"} {
		m, _ := filepath.Glob(filepath.Join(devRoot, pat))
		sort.Strings(m)
		out = append(out, m...)
	}
	return out
}

// SeedStore holds the seed once it has been read.
type SeedStore struct {
	mu   sync.RWMutex
	seed *Seed
	err  error
}

// Set records the seed (or the reason there is none yet).
func (s *SeedStore) Set(seed *Seed, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seed, s.err = seed, err
}

// Get returns the seed, or nil and the last error.
func (s *SeedStore) Get() (*Seed, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.seed == nil && s.err == nil {
		return nil, errors.New("seed not read yet")
	}
	return s.seed, s.err
}
