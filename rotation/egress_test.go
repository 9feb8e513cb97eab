package rotation

import (
	"fmt"
	"testing"

	"proxyfleet/messages"
)

// An entry's egress list reaches its Proxy as addresses; a list that does
// not read leaves the proxy without one, not out of the rotation.
func TestProxyOfReadsEgressAddrs(t *testing.T) {
	p := proxyOf(messages.RotationEntry{ID: "p1", Addr: "198.18.101.5:3128", EgressAddrs: []string{"198.18.101.5", "2001:db8:101::10/126"}})
	if got := fmt.Sprint(p.EgressAddrs); got != "[198.18.101.5 2001:db8:101::10 2001:db8:101::11 2001:db8:101::12 2001:db8:101::13]" {
		t.Errorf("EgressAddrs = %s", got)
	}
	if p := proxyOf(messages.RotationEntry{ID: "p1", EgressAddrs: []string{"2001:db8::/64"}}); p.EgressAddrs != nil || p.ID != "p1" {
		t.Errorf("an unreadable list gave %+v", p)
	}
}
