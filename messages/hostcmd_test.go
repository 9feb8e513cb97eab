package messages

import (
	"strings"
	"testing"
	"time"
)

func TestDecodeHostCommand(t *testing.T) {
	c, err := DecodeHostCommand([]byte(`{"v":1,"host":"h1","reason":"disk swap","by":"ops"}`), "h1")
	if err != nil || c.Host != "h1" || c.RecordReason() != "operator ops: disk swap" {
		t.Fatalf("decoded %+v, %v", c, err)
	}
	if c, err := DecodeHostCommand([]byte(`{"v":1,"host":"h1"}`), "h1"); err != nil || c.RecordReason() != "operator: quarantined by command" {
		t.Fatalf("without a reason: %+v, %v (%q)", c, err, c.RecordReason())
	}
	for _, tc := range []struct{ body, subject, field string }{
		{``, "h1", "body"},
		{`[]`, "h1", "body"},
		{`{"v":2,"host":"h1"}`, "h1", "v"},
		{`{"v":1}`, "h1", "host"},
		{`{"v":1,"host":"H1"}`, "H1", "host"},
		{`{"v":1,"host":"h1"}`, "h2", "host"},
		{`{"v":1,"host":"h1","until":"1h"}`, "h1", "until"},
		{`{"v":1,"host":"h1","reason":"` + strings.Repeat("x", MaxHostReason+1) + `"}`, "h1", "reason"},
		{`{"v":1,"host":"h1","reason":"a\nb"}`, "h1", "reason"},
		{`{"v":1,"host":"h1","by":"a:b"}`, "h1", "by"},
		{`{"v":1,"host":"h1","by":"` + strings.Repeat("x", MaxHostBy+1) + `"}`, "h1", "by"},
	} {
		_, err := DecodeHostCommand([]byte(tc.body), tc.subject)
		fe, ok := AsFieldError(err)
		if !ok || fe.Field != tc.field {
			t.Errorf("%s on %s: %v, want a rejection of %q", tc.body, tc.subject, err, tc.field)
		}
	}
}

func TestHostCommandSubjects(t *testing.T) {
	s := NewSubjects("pf")
	for _, op := range []string{OpHostQuarantine, OpHostRelease} {
		subj := s.HostCommand(op, "h1")
		gotOp, host, err := s.ParseHostCommand(subj)
		if err != nil || gotOp != op || host != "h1" {
			t.Errorf("%s: parsed %q %q %v", subj, gotOp, host, err)
		}
	}
	if got := s.HostCommand(OpHostQuarantine, "h1"); got != "pf.cmd.host.quarantine.h1" {
		t.Errorf("quarantine subject %q", got)
	}
	if got := s.HostResult("h1"); got != "pf.result.host.h1" {
		t.Errorf("result subject %q", got)
	}
	for _, bad := range []string{"pf.cmd.host.drain.h1", "pf.cmd.host.quarantine", "pf.cmd.host.quarantine.a.b", "pf.cmd.create.h1", "px.cmd.host.release.h1"} {
		if _, _, err := s.ParseHostCommand(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

func TestManualQuarantine(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		rec  HostRecord
		want bool
	}{
		{HostRecord{State: HostQuarantined}, true},
		{HostRecord{State: HostQuarantined, Until: now}, false},
		{HostRecord{State: HostOK}, false},
	} {
		if got := tc.rec.Manual(); got != tc.want {
			t.Errorf("%+v: Manual %v, want %v", tc.rec, got, tc.want)
		}
	}
}
