package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// cookieName is the session cookie's.
const cookieName = "proxyfleet_console"

// session is one login: its user, its role, and the token every action
// must carry (CSRF).
type session struct {
	user    string
	admin   bool
	csrf    string
	expires time.Time
	born    time.Time
}

// sessions holds the logins by a hash of their cookie's token, so that a
// token is compared by a map's lookup of its hash, never byte by byte.
// It holds at most max; a login beyond ends the oldest.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	max int
	now func() time.Time
	m   map[[32]byte]*session
}

func newSessions(ttl time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, max: max, now: now, m: map[[32]byte]*session{}}
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// start opens a session for user and returns its cookie's token.
func (ss *sessions) start(user string, admin bool) (string, *session) {
	tok := randomToken()
	now := ss.now()
	s := &session{user: user, admin: admin, csrf: randomToken(), expires: now.Add(ss.ttl), born: now}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, o := range ss.m {
		if !now.Before(o.expires) {
			delete(ss.m, k)
		}
	}
	for len(ss.m) >= ss.max {
		var oldest [32]byte
		var born time.Time
		for k, o := range ss.m {
			if born.IsZero() || o.born.Before(born) {
				oldest, born = k, o.born
			}
		}
		delete(ss.m, oldest)
	}
	ss.m[sha256.Sum256([]byte(tok))] = s
	return tok, s
}

// get returns the live session of token, if any.
func (ss *sessions) get(token string) (*session, bool) {
	if token == "" {
		return nil, false
	}
	k := sha256.Sum256([]byte(token))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[k]
	if !ok {
		return nil, false
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, k)
		return nil, false
	}
	return s, true
}

// end ends the session of token.
func (ss *sessions) end(token string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, sha256.Sum256([]byte(token)))
}

func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}

// checkPassword says whether password is user's, in time that does not
// depend on where they differ (both are hashed first, so their lengths
// do not show either); an unknown user costs the same.
func (s *Server) checkPassword(name, password string) (User, bool) {
	u, known := s.users[name]
	want := sha256.Sum256([]byte(u.Password))
	got := sha256.Sum256([]byte(password))
	match := subtle.ConstantTimeCompare(want[:], got[:]) == 1
	return u, known && match
}

// sessionOf returns the request's session, if it has a live one.
func (s *Server) sessionOf(r *http.Request) (*session, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil, false
	}
	return s.sessions.get(c.Value)
}

// validCSRF says whether the form's token is the session's.
func validCSRF(sess *session, token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(sess.csrf), []byte(token)) == 1
}

func setSessionCookie(w http.ResponseWriter, r *http.Request, token string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: token, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}
