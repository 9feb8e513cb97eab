package messages

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "proxy"

var (
	idRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
)

// ValidID reports whether id is a valid proxy id. Host names follow the same
// rule, since both become subject tokens and KV keys.
func ValidID(id string) bool { return idRE.MatchString(id) }

// ValidPrefix reports whether p can prefix proxyfleet's subjects.
func ValidPrefix(p string) bool { return prefixRE.MatchString(p) }

// Subjects builds and parses the subjects under one prefix.
type Subjects struct{ Prefix string }

// NewSubjects returns the subjects under prefix, or DefaultPrefix if empty.
func NewSubjects(prefix string) Subjects {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Subjects{Prefix: prefix}
}

func (s Subjects) join(parts ...string) string {
	return s.Prefix + "." + strings.Join(parts, ".")
}

// Command is the subject a client publishes op (OpCreate or OpDelete) for id on.
func (s Subjects) Command(op, id string) string { return s.join("cmd", op, id) }

// Create is <prefix>.cmd.create.<id>.
func (s Subjects) Create(id string) string { return s.join("cmd", OpCreate, id) }

// Delete is <prefix>.cmd.delete.<id>.
func (s Subjects) Delete(id string) string { return s.join("cmd", OpDelete, id) }

// Result is <prefix>.result.<id>.
func (s Subjects) Result(id string) string { return s.join("result", id) }

// State is <prefix>.state.<id>.
func (s Subjects) State(id string) string { return s.join("state", id) }

// Dead is <prefix>.dead.<id>.
func (s Subjects) Dead(id string) string { return s.join("dead", id) }

// Rotation is <prefix>.rotation.
func (s Subjects) Rotation() string { return s.join("rotation") }

// Report is where consumers report that proxy id failed them.
func (s Subjects) Report(id string) string { return s.join("report", id) }

// ReportAll matches every proxy's reports.
func (s Subjects) ReportAll() string { return s.join("report", "*") }

// Work is <prefix>.work.<host>.<id>, the execution queue of one host.
func (s Subjects) Work(host, id string) string { return s.join("work", host, id) }

// WorkHost matches every work item of one host.
func (s Subjects) WorkHost(host string) string { return s.join("work", host, "*") }

// Wildcards of the streams.
func (s Subjects) CreateAll() string { return s.join("cmd", OpCreate, "*") }
func (s Subjects) DeleteAll() string { return s.join("cmd", OpDelete, "*") }
func (s Subjects) ResultAll() string { return s.join("result", ">") }
func (s Subjects) StateAll() string  { return s.join("state", ">") }
func (s Subjects) DeadAll() string   { return s.join("dead", ">") }
func (s Subjects) WorkAll() string   { return s.join("work", ">") }

// ParseCommand splits <prefix>.cmd.<op>.<id> into op and id. The id token is
// returned as is, unvalidated: validation reports it with its field.
func (s Subjects) ParseCommand(subject string) (op, id string, err error) {
	rest, ok := strings.CutPrefix(subject, s.Prefix+".cmd.")
	if !ok {
		return "", "", fmt.Errorf("subject %q: not a command subject", subject)
	}
	op, id, ok = strings.Cut(rest, ".")
	if !ok || (op != OpCreate && op != OpDelete) || id == "" || strings.Contains(id, ".") {
		return "", "", fmt.Errorf("subject %q: want %s.cmd.{create,delete}.<id>", subject, s.Prefix)
	}
	return op, id, nil
}

// ParseWork splits <prefix>.work.<host>.<id>.
func (s Subjects) ParseWork(subject string) (host, id string, err error) {
	rest, ok := strings.CutPrefix(subject, s.Prefix+".work.")
	if ok {
		host, id, ok = strings.Cut(rest, ".")
	}
	if !ok || host == "" || id == "" || strings.Contains(id, ".") {
		return "", "", fmt.Errorf("subject %q: want %s.work.<host>.<id>", subject, s.Prefix)
	}
	return host, id, nil
}

// ParseState returns the id of <prefix>.state.<id>.
func (s Subjects) ParseState(subject string) (string, error) {
	id, ok := strings.CutPrefix(subject, s.Prefix+".state.")
	if !ok || id == "" || strings.Contains(id, ".") {
		return "", fmt.Errorf("subject %q: want %s.state.<id>", subject, s.Prefix)
	}
	return id, nil
}

// ParseReport returns the proxy id of a <prefix>.report.<id> subject.
func (s Subjects) ParseReport(subject string) (string, error) {
	id, ok := strings.CutPrefix(subject, s.Prefix+".report.")
	if !ok || id == "" || strings.Contains(id, ".") {
		return "", fmt.Errorf("subject %q: want %s.report.<id>", subject, s.Prefix)
	}
	return id, nil
}

// RotationChanges is <prefix>.rotation.changes, the rotation's feed of
// changes (RotationChanges).
func (s Subjects) RotationChanges() string { return s.join("rotation", "changes") }

// RotationGet is <prefix>.rotation.get, where the publishing health process
// answers the rotation in pages (RotationGet, RotationPage).
func (s Subjects) RotationGet() string { return s.join("rotation", "get") }

// Ban is <prefix>.ban, where health answers requests to add or remove a
// ban (package bans, Request and Reply).
func (s Subjects) Ban() string { return s.join("ban") }
