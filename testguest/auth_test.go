package main

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

func bcryptHash(t *testing.T, pass string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

func TestParsePasswdFile(t *testing.T) {
	h := bcryptHash(t, "s3cret") // $2a$
	h2b := "$2b$" + strings.TrimPrefix(h, "$2a$")
	h2y := "$2y$" + strings.TrimPrefix(h, "$2a$")
	users, warnings := ParsePasswdFile([]byte("# users\nfleet:" + h + "\nb:" + h2b + "\n\ny:" + h2y + "\nmd5:$apr1$abc$def\nnocolon\n:" + h + "\n"))
	if len(users) != 3 || string(users["fleet"]) != h || string(users["b"]) != h2b || string(users["y"]) != h2y {
		t.Fatalf("users %q", users)
	}
	if len(warnings) != 3 || !strings.Contains(warnings[0], "md5") || !strings.Contains(warnings[1], "line 7") {
		t.Fatalf("warnings %q", warnings)
	}
	// Every bcrypt prefix verifies.
	a := NewBasicAuth(users, false, time.Hour)
	for _, u := range []string{"fleet", "b", "y"} {
		if _, ok := a.Check(basic(u, "s3cret")); !ok {
			t.Errorf("%s: right password refused", u)
		}
	}
}

func TestBasicAuthCheck(t *testing.T) {
	users := map[string][]byte{"fleet": []byte(bcryptHash(t, "s3cret")), "Mixed": []byte(bcryptHash(t, "pw"))}
	a := NewBasicAuth(users, false, time.Hour)
	for _, tc := range []struct {
		header string
		user   string
		ok     bool
	}{
		{basic("fleet", "s3cret"), "fleet", true},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("fleet:s3cret")), "fleet", true},
		{basic("FLEET", "s3cret"), "fleet", true}, // casesensitive off lowercases the name
		{basic("fleet", "S3cret"), "fleet", false},
		{basic("fleet", ""), "fleet", false},
		{basic("nobody", "s3cret"), "nobody", false},
		{basic("Mixed", "pw"), "mixed", false}, // lowercased: no such entry
		{"Bearer abc", "", false},
		{"Basic !!!", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("nocolon")), "", false},
		{"", "", false},
	} {
		user, ok := a.Check(tc.header)
		if user != tc.user || ok != tc.ok {
			t.Errorf("%q: got %q %t, want %q %t", tc.header, user, ok, tc.user, tc.ok)
		}
	}
	cs := NewBasicAuth(users, true, time.Hour)
	if _, ok := cs.Check(basic("Mixed", "pw")); !ok {
		t.Error("casesensitive on: Mixed refused")
	}
	if _, ok := cs.Check(basic("FLEET", "s3cret")); ok {
		t.Error("casesensitive on: FLEET accepted")
	}
}

func TestBasicAuthCachesChecks(t *testing.T) {
	a := NewBasicAuth(map[string][]byte{"fleet": []byte(bcryptHash(t, "s3cret"))}, false, time.Hour)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	for i := 0; i < 3; i++ {
		if _, ok := a.Check(basic("fleet", "s3cret")); !ok {
			t.Fatal("refused")
		}
	}
	if n := a.bcryptCount(); n != 1 {
		t.Fatalf("%d bcrypt comparisons for 3 checks, want 1", n)
	}
	for i := 0; i < 3; i++ {
		if _, ok := a.Check(basic("fleet", "wrong")); ok {
			t.Fatal("wrong password accepted")
		}
	}
	if n := a.bcryptCount(); n != 2 {
		t.Fatalf("%d bcrypt comparisons after 3 wrong checks, want 2", n)
	}
	// After credentialsttl the password is verified again.
	now = now.Add(time.Hour + time.Second)
	if _, ok := a.Check(basic("fleet", "s3cret")); !ok || a.bcryptCount() != 3 {
		t.Fatalf("after the ttl: ok=%t, %d comparisons, want 3", ok, a.bcryptCount())
	}
}
