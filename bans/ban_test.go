package bans

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
)

func TestDecodeRequest(t *testing.T) {
	r, err := DecodeRequest([]byte(`{"v":1,"op":"add","address":"::ffff:203.0.113.7","site":"WWW.Shop.Example.","for":"30m","source":"cli","reason":"captcha wall"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Address != "203.0.113.7" || r.Site != "shop.example" || r.For.D() != 30*time.Minute {
		t.Errorf("decoded %+v", r)
	}
	b := r.Ban(t0)
	if err := b.Validate(); err != nil {
		t.Fatalf("the ban of a valid request: %v", err)
	}
	body, _ := json.Marshal(b)
	back, err := DecodeBan(body)
	if err != nil || back != b {
		t.Errorf("DecodeBan(%s) = %+v, %v", body, back, err)
	}
	if b.Key() != "203-0-113-7.shop.example" {
		t.Errorf("key %q", b.Key())
	}

	for _, c := range []struct{ body, field string }{
		{``, "body"},
		{`[]`, "body"},
		{`{"v":2,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli"}`, "v"},
		{`{"v":1,"op":"ban","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli"}`, "op"},
		{`{"v":1,"op":"add","address":"203.0.113.7:80","site":"a.example","for":"1m","source":"cli"}`, "address"},
		{`{"v":1,"op":"add","address":"fe80::1%eth0","site":"a.example","for":"1m","source":"cli"}`, "address"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a..example","for":"1m","source":"cli"}`, "site"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"","for":"1m","source":"cli"}`, "site"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","source":"cli"}`, "for"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"-1m","source":"cli"}`, "for"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"9999h","source":"cli"}`, "for"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"anyone"}`, "source"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli","reason":"a\u001b[2Jb"}`, "reason"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli","reason":"` + strings.Repeat("x", MaxReason+1) + `"}`, "reason"},
		{`{"v":1,"op":"remove","address":"203.0.113.7","site":"a.example","for":"1m"}`, "for"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli","until":"x"}`, "until"},
		{`{"v":1,"op":"add","address":"203.0.113.7","site":"a.example","for":"1m","source":"cli","Op":"add"}`, "Op"},
	} {
		_, err := DecodeRequest([]byte(c.body))
		fe, ok := messages.AsFieldError(err)
		if !ok || fe.Field != c.field {
			t.Errorf("DecodeRequest(%.60s) = %v, want an error naming %s", c.body, err, c.field)
		}
	}
	if _, err := DecodeRequest([]byte(`{"v":1,"op":"remove","address":"203.0.113.7","site":"a.example"}`)); err != nil {
		t.Errorf("a remove: %v", err)
	}
}

func TestBanValidateRefusesUncanonical(t *testing.T) {
	good := Ban{V: 1, Address: "2001:db8::1", Site: "shop.example", At: t0, Until: t0.Add(time.Minute), Source: SourceRule}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for field, b := range map[string]Ban{
		"address": {V: 1, Address: "2001:DB8::1", Site: "shop.example", At: t0, Until: t0.Add(time.Minute), Source: SourceRule},
		"site":    {V: 1, Address: "2001:db8::1", Site: "www.shop.example", At: t0, Until: t0.Add(time.Minute), Source: SourceRule},
		"until":   {V: 1, Address: "2001:db8::1", Site: "shop.example", At: t0, Until: t0, Source: SourceRule},
		"at":      {V: 1, Address: "2001:db8::1", Site: "shop.example", Until: t0, Source: SourceRule},
	} {
		fe, ok := messages.AsFieldError(b.Validate())
		if !ok || fe.Field != field {
			t.Errorf("%+v: %v, want an error naming %s", b, fe, field)
		}
	}
}
