package client

import "testing"

func TestMayPublish(t *testing.T) {
	p := &subjectPermission{
		Allow: []string{"proxy.cmd.*.*", "$JS.API.DIRECT.GET.PROXY_EVENTS.>", "$JS.API.STREAM.INFO.*"},
		Deny:  []string{"$JS.API.STREAM.INFO.KV_PROXY_DESIRED"},
	}
	for subject, want := range map[string]bool{
		"proxy.cmd.create.p1":                                true,
		"proxy.cmd.create":                                   false,
		"proxy.cmd.create.p1.x":                              false,
		"$JS.API.DIRECT.GET.PROXY_EVENTS.proxy.state.p1":     true,
		"$JS.API.DIRECT.GET.PROXY_EVENTS":                    false,
		"$JS.API.STREAM.INFO.PROXY_EVENTS":                   true,
		"$JS.API.STREAM.INFO.KV_PROXY_DESIRED":               false,
		"$JS.API.DIRECT.GET.KV_PROXY_DESIRED.$KV.PROXY_D.p1": false,
	} {
		if got := p.mayPublish(subject); got != want {
			t.Errorf("mayPublish(%q) = %v, want %v", subject, got, want)
		}
	}
	var none *subjectPermission
	if !none.mayPublish("anything.at.all") {
		t.Error("no permissions refused a subject")
	}
	if (&subjectPermission{Deny: []string{">"}}).mayPublish("a") {
		t.Error("deny > allowed a subject")
	}
}
