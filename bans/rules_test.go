package bans

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The rules of the example.
var example = []RuleSpec{
	{Status: []int{403, 429}, Ban: 30 * time.Minute, Retry: true},
	{Sites: []string{"*.shop.example"}, Body: "(?i)captcha", Ban: 2 * time.Hour, Retry: true},
	{Status: []int{503}, Retry: true},
	{FirstByte: 20 * time.Second, Sites: []string{"slow.example", "2001:db8::5"}, Ban: time.Minute},
}

func TestMatch(t *testing.T) {
	rs, err := Compile(example)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		a    Answer
		want Actions
	}{
		{"429 anywhere", Answer{Host: "a.example", Status: 429}, Actions{0, 30 * time.Minute, true}},
		{"200 is fine", Answer{Host: "a.example", Status: 200}, None},
		{"captcha under shop", Answer{Host: "WWW.Shop.Example.", Status: 200, Body: []byte("<h1>CAPTCHA</h1>")}, Actions{1, 2 * time.Hour, true}},
		{"captcha at shop itself is not under it", Answer{Host: "shop.example", Status: 200, Body: []byte("captcha")}, None},
		{"captcha elsewhere", Answer{Host: "other.example", Status: 200, Body: []byte("captcha")}, None},
		{"body not read", Answer{Host: "www.shop.example", Status: 200}, None},
		{"first rule wins", Answer{Host: "www.shop.example", Status: 403, Body: []byte("captcha")}, Actions{0, 30 * time.Minute, true}},
		{"503 retried, no ban", Answer{Host: "a.example", Status: 503}, Actions{2, 0, true}},
		{"slow", Answer{Host: "slow.example", Status: 200, FirstByte: 25 * time.Second}, Actions{3, time.Minute, false}},
		{"slow, no answer", Answer{Host: "[2001:DB8::5]", FirstByte: 20 * time.Second}, Actions{3, time.Minute, false}},
		{"fast enough", Answer{Host: "slow.example", Status: 200, FirstByte: 19 * time.Second}, None},
		{"slow elsewhere", Answer{Host: "fast.example", Status: 200, FirstByte: time.Hour}, None},
	} {
		if got := rs.Match(c.a); got != c.want {
			t.Errorf("%s: Match = %+v, want %+v", c.name, got, c.want)
		}
	}
	if !rs.NeedsBody("www.shop.example") || rs.NeedsBody("shop.example") || rs.NeedsBody("a.example") {
		t.Error("NeedsBody reads bodies beyond the sites a body rule names")
	}
	var none *Rules
	if none.Match(Answer{Status: 403}) != None || none.NeedsBody("x") || none.Len() != 0 {
		t.Error("nil Rules decided something")
	}
}

// BenchmarkMatch measures the rules' cost on an answer no rule takes, the
// common case on the gateway's path; its allocations are a budget (0),
// reported here, not asserted.
func BenchmarkMatch(b *testing.B) {
	rs, err := Compile(example)
	if err != nil {
		b.Fatal(err)
	}
	a := Answer{Host: "www.shop.example", Status: 200, Body: []byte("no robots here")}
	b.ReportAllocs()
	for b.Loop() {
		rs.Match(a)
	}
}

func TestCompileRefuses(t *testing.T) {
	many := make([]RuleSpec, MaxRules+1)
	for _, c := range []struct {
		name  string
		specs []RuleSpec
		path  string
	}{
		{"status out of range", []RuleSpec{{Status: []int{500}, Retry: true}, {Status: []int{200, 99}, Retry: true}}, "gateway.rules[1].status[1]"},
		{"no trigger", []RuleSpec{{Retry: true}}, "gateway.rules[0].status"},
		{"status twice", []RuleSpec{{Status: []int{403, 403}, Retry: true}}, "gateway.rules[0].status[1]"},
		{"no action", []RuleSpec{{Status: []int{403}}}, "gateway.rules[0].ban"},
		{"ban too short", []RuleSpec{{Status: []int{403}, Ban: time.Millisecond}}, "gateway.rules[0].ban"},
		{"ban too long", []RuleSpec{{Status: []int{403}, Ban: 365 * 24 * time.Hour}}, "gateway.rules[0].ban"},
		{"bad regexp", []RuleSpec{{Sites: []string{"a.example"}, Body: "(", Retry: true}}, "gateway.rules[0].body"},
		{"body everywhere", []RuleSpec{{Body: "captcha", Retry: true}}, "gateway.rules[0].sites"},
		{"bad site", []RuleSpec{{Status: []int{403}, Sites: []string{"ok.example", "*"}, Retry: true}}, "gateway.rules[0].sites[1]"},
		{"inner wildcard", []RuleSpec{{Status: []int{403}, Sites: []string{"a.*.example"}, Retry: true}}, "gateway.rules[0].sites[0]"},
		{"negative first byte", []RuleSpec{{FirstByte: -time.Second, Retry: true}}, "gateway.rules[0].first_byte"},
		{"too many", many, "gateway.rules"},
	} {
		_, err := Compile(c.specs)
		var re *RuleError
		if !errors.As(err, &re) {
			t.Errorf("%s: Compile = %v, want a *RuleError", c.name, err)
			continue
		}
		if got := re.Path("gateway.rules"); got != c.path {
			t.Errorf("%s: error at %s (%v), want %s", c.name, got, err, c.path)
		}
		if !strings.HasPrefix(err.Error(), "rules") {
			t.Errorf("%s: %q does not name the rule", c.name, err)
		}
	}
}
