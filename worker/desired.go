package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"sort"

	"proxyfleet/messages"
)

// specHash identifies what needs a new VM when it changes.
func specHash(host, image string, cpus, mem int, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	kv := make([][2]string, len(keys))
	for i, k := range keys {
		kv[i] = [2]string{k, labels[k]}
	}
	b, _ := json.Marshal(struct {
		Host   string
		Image  string
		CPUs   int
		Mem    int
		Labels [][2]string
	}{host, image, cpus, mem, kv})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// pickHost chooses a host for a proxy that has none (a delete of a proxy
// never created through us), by rendezvous hashing over the configured
// hosts: every worker with the same host list picks the same host.
func pickHost(id string, hosts []string) string {
	var best string
	var bestScore uint64
	for _, h := range hosts {
		if s := rendezvous(h, id); best == "" || s > bestScore {
			best, bestScore = h, s
		}
	}
	return best
}

// rendezvous is host's score for proxy id: the stable hash placement
// breaks ties with, each id ranking the hosts in an order of its own
// (TestRendezvousSpreadsIDs). FNV-1a's high bits hardly change with the
// last bytes it hashes, and scores are compared whole, so its sum is
// mixed by MurmurHash3's finalizer (fmix64), which spreads every bit of
// it over the whole score (docs/DECISIONS.md, "Placement prefers the
// worker's own hosts within a band of the most free room").
func rendezvous(host, id string) uint64 {
	f := fnv.New64a()
	f.Write([]byte(host))
	f.Write([]byte{0})
	f.Write([]byte(id))
	h := f.Sum64()
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// commandKey is the PROXY_CMDIDS key of a command id: KV keys allow a
// narrow alphabet and command ids are client strings.
func commandKey(commandID string) string {
	sum := sha256.Sum256([]byte(commandID))
	return hex.EncodeToString(sum[:16])
}

// commandRecord is the value of a PROXY_CMDIDS key.
type commandRecord struct {
	ID  string `json:"id"`
	Seq uint64 `json:"seq"`
}

// workHosts are the hosts a record needs work on: its host and, after a
// move, the one it ran on before.
func workHosts(d *messages.Desired) []string {
	var out []string
	add := func(h string) {
		if h == "" {
			return
		}
		for _, x := range out {
			if x == h {
				return
			}
		}
		out = append(out, h)
	}
	add(d.Host)
	add(d.PrevHost)
	return out
}
