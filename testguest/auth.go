package main

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// maxCached bounds each credential cache; a full cache is emptied (a
// client cycling through passwords costs bcrypt again, nothing more).
const maxCached = 256

// BasicAuth checks Proxy-Authorization: Basic against a basic_ncsa_auth
// password file. Only bcrypt hashes are verified (what proxyfleet writes).
type BasicAuth struct {
	users         map[string][]byte // user → bcrypt hash
	caseSensitive bool
	ttl           time.Duration
	now           func() time.Time

	mu   sync.Mutex
	good map[[32]byte]time.Time // credentials that verified, until when
	bad  map[[32]byte]struct{}  // credentials that did not
	// bcrypts counts hash comparisons, for tests.
	bcrypts int
}

// ParsePasswdFile reads basic_ncsa_auth's "user:hash" lines. Lines it cannot
// use are skipped (basic_ncsa_auth ignores them too) and described in
// warnings; an entry with another hash than bcrypt can never log in.
func ParsePasswdFile(b []byte) (users map[string][]byte, warnings []string) {
	users = map[string][]byte{}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l[0] == '#' {
			continue
		}
		u, h, ok := strings.Cut(l, ":")
		if !ok || u == "" {
			warnings = append(warnings, fmt.Sprintf("line %d: not user:hash", i+1))
			continue
		}
		if !strings.HasPrefix(h, "$2a$") && !strings.HasPrefix(h, "$2b$") && !strings.HasPrefix(h, "$2y$") {
			warnings = append(warnings, fmt.Sprintf("line %d: user %s: not a bcrypt hash; cannot log in", i+1, u))
			continue
		}
		users[u] = []byte(h)
	}
	return users, warnings
}

// NewBasicAuth returns a checker for users (from ParsePasswdFile). A
// verified password is remembered for ttl, as squid's credentialsttl.
func NewBasicAuth(users map[string][]byte, caseSensitive bool, ttl time.Duration) *BasicAuth {
	return &BasicAuth{users: users, caseSensitive: caseSensitive, ttl: ttl, now: time.Now,
		good: map[[32]byte]time.Time{}, bad: map[[32]byte]struct{}{}}
}

// Check reads a Proxy-Authorization value: the user name, and whether the
// credentials are valid. Only the first check of given credentials (within
// ttl) runs bcrypt; the cache keys are hashes, not the passwords.
func (a *BasicAuth) Check(header string) (string, bool) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", false
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	if !ok || user == "" {
		return "", false
	}
	if !a.caseSensitive {
		// squid lowercases the name before asking the helper (casesensitive off).
		user = strings.ToLower(user)
	}
	key := sha256.Sum256([]byte(user + "\x00" + pass))
	now := a.now()
	a.mu.Lock()
	until, good := a.good[key]
	_, bad := a.bad[key]
	a.mu.Unlock()
	if good && now.Before(until) {
		return user, true
	}
	if bad {
		// The file cannot change while the guest runs: still wrong.
		return user, false
	}
	hash, known := a.users[user]
	ok = known && bcrypt.CompareHashAndPassword(hash, []byte(pass)) == nil
	a.mu.Lock()
	defer a.mu.Unlock()
	if known {
		a.bcrypts++
	}
	if ok {
		if len(a.good) >= maxCached {
			clear(a.good)
		}
		a.good[key] = now.Add(a.ttl)
	} else {
		if len(a.bad) >= maxCached {
			clear(a.bad)
		}
		a.bad[key] = struct{}{}
	}
	return user, ok
}

func (a *BasicAuth) bcryptCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bcrypts
}
