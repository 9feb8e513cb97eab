package client

import (
	"testing"

	"proxyfleet/messages"
)

// List's filters: host and labels from the desired record, else the
// latest event; state as Status.State says; all of them must hold; a
// deleted proxy only with IncludeDeleted.
func TestListFilters(t *testing.T) {
	running := &Status{ID: "a",
		Desired: &messages.Desired{Op: messages.OpCreate, Host: "h1", Labels: map[string]string{"pool": "eu", "tier": "x"}},
		Event:   &messages.StateEvent{State: messages.StateRunning, Host: "h2"}}
	pending := &Status{ID: "b", Desired: &messages.Desired{Op: messages.OpCreate, Host: "h1"}}
	unread := &Status{ID: "c", DesiredUnread: true,
		Event: &messages.StateEvent{State: messages.StateFailed, Host: "h1", Labels: map[string]string{"pool": "eu"}}}
	deleted := &Status{ID: "d", Desired: &messages.Desired{Op: messages.OpDelete, Host: "h1"},
		Event: &messages.StateEvent{State: messages.StateDeleted, Host: "h1"}}
	all := []*Status{running, pending, unread, deleted}
	for _, c := range []struct {
		name string
		opts []ListOption
		want string
	}{
		{"none", nil, "abc"},
		{"deleted too", []ListOption{IncludeDeleted()}, "abcd"},
		{"the event's host over the desired one", []ListOption{OnHost("h2")}, "a"},
		{"host", []ListOption{OnHost("h1")}, "bc"},
		{"state", []ListOption{InState(messages.StateRunning)}, "a"},
		{"pending", []ListOption{InState("pending")}, "b"},
		{"deleted state", []ListOption{InState(messages.StateDeleted), IncludeDeleted()}, "d"},
		{"label from the record or the event", []ListOption{WithLabel("pool", "eu")}, "ac"},
		{"every label must hold", []ListOption{WithLabel("pool", "eu"), WithLabel("tier", "x")}, "a"},
		{"a label's value must match", []ListOption{WithLabel("pool", "us")}, ""},
		{"filters together", []ListOption{OnHost("h1"), WithLabel("pool", "eu")}, "c"},
	} {
		var o listOptions
		for _, f := range c.opts {
			f(&o)
		}
		got := ""
		for _, s := range all {
			if o.keep(s) {
				got += s.ID
			}
		}
		if got != c.want {
			t.Errorf("%s: kept %q, want %q", c.name, got, c.want)
		}
	}
}
