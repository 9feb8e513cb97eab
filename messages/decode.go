package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// FieldError is a rejected input, naming the field at fault. Field "body" means
// the body as a whole (empty, oversized, not JSON, trailing data).
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// AsFieldError returns the FieldError inside err, if any.
func AsFieldError(err error) (*FieldError, bool) {
	var fe *FieldError
	ok := errors.As(err, &fe)
	return fe, ok
}

// decodeStrict decodes exactly one JSON object into v: unknown fields,
// trailing data and oversized or empty bodies are errors naming their field.
func decodeStrict(body []byte, v any) error {
	if len(body) == 0 {
		return fieldErr("body", "empty")
	}
	if len(body) > MaxBodySize {
		return fieldErr("body", "%d bytes, more than the limit of %d", len(body), MaxBodySize)
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return fieldErr("body", "not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldErr(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fieldErr("body", "trailing data after the JSON object")
	}
	return exactKeys(body, v)
}

// exactKeys refuses keys that encoding/json matched case-insensitively
// ("ID" for "id"): the contract's field names are exact.
func exactKeys(body []byte, v any) error {
	t := reflect.TypeOf(v)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return fieldErr("body", "malformed JSON: %v", err)
	}
	known := jsonNames(t.Elem())
	for k := range m {
		if !known[k] {
			return unknownField(k)
		}
	}
	return nil
}

// unknownField names a key the contract does not have; a key with no name
// is reported against the body, since an empty field says nothing.
func unknownField(name string) error {
	if name == "" {
		return fieldErr("body", `unknown field ""`)
	}
	return fieldErr(name, "unknown field")
}

var namesCache sync.Map // reflect.Type -> map[string]bool

func jsonNames(t reflect.Type) map[string]bool {
	if v, ok := namesCache.Load(t); ok {
		return v.(map[string]bool)
	}
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		names[name] = true
	}
	namesCache.Store(t, names)
	return names
}

// jsonFieldErr names the field encoding/json complained about.
func jsonFieldErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fieldErr(te.Field, "want %s, got JSON %s", te.Type, te.Value)
	}
	msg := err.Error()
	if q, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		// encoding/json has no typed error for this one; the field name is
		// the rest of its message, quoted with %q.
		if name, err := strconv.Unquote(q); err == nil {
			return unknownField(name)
		}
	}
	return fieldErr("body", "malformed JSON: %v", err)
}

var (
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
)

func checkVersionAndID(v int, id, subjectID string) error {
	if v != Version {
		return fieldErr("v", "version %d is not supported, want %d", v, Version)
	}
	if id == "" {
		return fieldErr("id", "missing")
	}
	if !ValidID(id) {
		return fieldErr("id", "%q is not a valid id (lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit)", truncate(id))
	}
	if subjectID != id {
		return fieldErr("id", "body id %q does not match the subject's %q", id, truncate(subjectID))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// DecodeCreate decodes and validates a create command published with
// subjectID as the subject's id token.
//
// An explicit "cpus": 0 or "memory_mib": 0 is out of range; an absent field
// takes the configured default.
func DecodeCreate(body []byte, subjectID string) (CreateCommand, error) {
	// The wire form has pointers where presence matters.
	var w struct {
		V         int               `json:"v"`
		ID        string            `json:"id"`
		Host      string            `json:"host"`
		Image     string            `json:"image"`
		CPUs      *int              `json:"cpus"`
		MemoryMiB *int              `json:"memory_mib"`
		Labels    map[string]string `json:"labels"`
	}
	if err := decodeStrict(body, &w); err != nil {
		return CreateCommand{}, err
	}
	c := CreateCommand{V: w.V, ID: w.ID, Host: w.Host, Image: w.Image, Labels: w.Labels}
	if w.CPUs != nil {
		if *w.CPUs == 0 {
			return c, fieldErr("cpus", "0 is out of range [%d, %d]", MinCPUs, MaxCPUs)
		}
		c.CPUs = *w.CPUs
	}
	if w.MemoryMiB != nil {
		if *w.MemoryMiB == 0 {
			return c, fieldErr("memory_mib", "0 is out of range [%d, %d]", MinMemoryMiB, MaxMemoryMiB)
		}
		c.MemoryMiB = *w.MemoryMiB
	}
	return c, c.Validate(subjectID)
}

// Validate checks everything about c that needs no configuration. Host and
// image names are checked for syntax here, for existence by intake.
func (c CreateCommand) Validate(subjectID string) error {
	if err := checkVersionAndID(c.V, c.ID, subjectID); err != nil {
		return err
	}
	if c.Host != "" && !ValidID(c.Host) {
		return fieldErr("host", "%q is not a valid host name", truncate(c.Host))
	}
	if c.Image != "" && !ValidID(c.Image) {
		return fieldErr("image", "%q is not a valid image name", truncate(c.Image))
	}
	if c.CPUs != 0 && (c.CPUs < MinCPUs || c.CPUs > MaxCPUs) {
		return fieldErr("cpus", "%d is out of range [%d, %d]", c.CPUs, MinCPUs, MaxCPUs)
	}
	if c.MemoryMiB != 0 && (c.MemoryMiB < MinMemoryMiB || c.MemoryMiB > MaxMemoryMiB) {
		return fieldErr("memory_mib", "%d is out of range [%d, %d]", c.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	}
	if len(c.Labels) > MaxLabels {
		return fieldErr("labels", "%d labels, at most %d", len(c.Labels), MaxLabels)
	}
	for k, v := range c.Labels {
		if !labelKeyRE.MatchString(k) {
			return fieldErr("labels", "key %q is not a valid label key", truncate(k))
		}
		if len(v) > 255 {
			return fieldErr("labels", "value of %q is longer than 255 bytes", k)
		}
	}
	return nil
}

// DecodeDelete decodes and validates a delete command.
func DecodeDelete(body []byte, subjectID string) (DeleteCommand, error) {
	var d DeleteCommand
	if err := decodeStrict(body, &d); err != nil {
		return DeleteCommand{}, err
	}
	return d, checkVersionAndID(d.V, d.ID, subjectID)
}

// Decode decodes any body strictly into v (results, events, snapshots), for
// consumers of the wire types.
func Decode(body []byte, v any) error { return decodeStrict(body, v) }
