package client

import "testing"

func TestBanFilterKeys(t *testing.T) {
	for _, c := range []struct {
		f    BanFilter
		want string
	}{
		{BanFilter{}, ">"},
		{BanFilter{Site: "www.Shop.example."}, "*.shop.example"},
		{BanFilter{Site: "[2001:db8::1]"}, "*.=2001_db8__1"},
		{BanFilter{Address: "203.0.113.7"}, "203-0-113-7.>"},
		{BanFilter{Address: "203.0.113.7", Site: "a.shop.example"}, "203-0-113-7.shop.example"},
	} {
		got, err := c.f.keys()
		if err != nil || got != c.want {
			t.Errorf("%+v: %q, %v; want %q", c.f, got, err, c.want)
		}
	}
	for _, f := range []BanFilter{{Site: "a..b"}, {Site: "*"}, {Address: "203.0.113.7/32"}, {Address: "x", Site: "a.example"}} {
		if got, err := f.keys(); err == nil {
			t.Errorf("%+v: %q, want an error", f, got)
		}
	}
}
