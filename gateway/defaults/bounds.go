package defaults

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind says how a Bound's values read in a file and in an error: a
// count, bytes, or a duration (int64 nanoseconds).
type Kind int

const (
	Count Kind = iota
	Bytes
	Duration
)

// Bound is one of the gateway's numeric settings: its default and the
// range its value must be in once the default is filled. Package config
// checks a file against it and gateway.Config.WithDefaults/Validate a
// Config, so a value is refused alike from either, with the setting
// named by Path.
type Bound struct {
	// Path is the setting's key in the file, from the top
	// ("gateway.retries"); a user's setting has "[]" for the user's
	// index ("gateway.users[].max_conns", see At).
	Path    string
	Kind    Kind
	Default int64
	// Min and Max are the least and the greatest value accepted.
	Min, Max int64
	// Off: a zero is a value of its own (the setting's feature off), not
	// a request for the default. A file tells an absent key (the
	// default) from 0; in gateway.Config, whose zero asks for the
	// default, a negative value asks for 0.
	Off bool
}

// The bounds. Mins refuse values that would make the gateway refuse
// what it should carry or close what is live (a bare integer in a
// duration field is nanoseconds: "5" is 5ns, refused); maxes refuse
// values that would let one client hold memory or a connection without
// end, or that are surely a slip of a unit.
var (
	RetriesBound = Bound{Path: "gateway.retries", Kind: Count, Default: Retries, Min: 0, Max: 10, Off: true}

	ConnectTimeoutBound = Bound{Path: "gateway.connect_timeout", Kind: Duration, Default: int64(ConnectTimeout), Min: int64(100 * time.Millisecond), Max: int64(5 * time.Minute)}
	// ResponseTimeoutBound's maximum is long: it includes the target's
	// time to answer.
	ResponseTimeoutBound = Bound{Path: "gateway.response_timeout", Kind: Duration, Default: int64(ResponseTimeout), Min: int64(100 * time.Millisecond), Max: int64(time.Hour)}
	// FirstByteTimeoutBound holds under a response_timeout that is
	// longer than Min: first_byte_timeout is never longer than
	// response_timeout, and a shorter response_timeout is also its
	// default and its least value (FirstByteDefault, CheckFirstByte).
	// The minimum leaves a live proxy's acknowledgement a few round
	// trips and a retransmission.
	FirstByteTimeoutBound = Bound{Path: "gateway.first_byte_timeout", Kind: Duration, Default: int64(FirstByteTimeout), Min: int64(MinFirstByteTimeout), Max: int64(time.Hour)}
	// RetryAfterBound: Retry-After is sent in whole seconds.
	RetryAfterBound       = Bound{Path: "gateway.retry_after", Kind: Duration, Default: int64(RetryAfter), Min: int64(time.Second), Max: int64(time.Hour)}
	DrainTimeoutBound     = Bound{Path: "gateway.drain_timeout", Kind: Duration, Default: int64(DrainTimeout), Min: int64(100 * time.Millisecond), Max: int64(time.Hour)}
	HandshakeTimeoutBound = Bound{Path: "gateway.handshake_timeout", Kind: Duration, Default: int64(HandshakeTimeout), Min: int64(100 * time.Millisecond), Max: int64(5 * time.Minute)}
	HeaderTimeoutBound    = Bound{Path: "gateway.header_timeout", Kind: Duration, Default: int64(HeaderTimeout), Min: int64(100 * time.Millisecond), Max: int64(5 * time.Minute)}
	KeepAliveTimeoutBound = Bound{Path: "gateway.keepalive_timeout", Kind: Duration, Default: int64(KeepAliveTimeout), Min: int64(100 * time.Millisecond), Max: int64(24 * time.Hour)}
	IdleTimeoutBound      = Bound{Path: "gateway.idle_timeout", Kind: Duration, Default: int64(IdleTimeout), Min: int64(100 * time.Millisecond), Max: int64(24 * time.Hour)}

	MaxConnsBound           = Bound{Path: "gateway.users[].max_conns", Kind: Count, Default: MaxConns, Min: 1, Max: 1 << 20}
	AuthFailuresBound       = Bound{Path: "gateway.auth_failures", Kind: Count, Default: AuthFailures, Min: 1, Max: 10_000}
	MaxHeaderBytesBound     = Bound{Path: "gateway.max_header_bytes", Kind: Bytes, Default: MaxHeaderBytes, Min: MinMaxHeaderBytes, Max: 16 << 20}
	MaxHeaderFieldsBound    = Bound{Path: "gateway.max_header_fields", Kind: Count, Default: MaxHeaderFields, Min: 1, Max: 10_000}
	MaxUnauthenticatedBound = Bound{Path: "gateway.max_unauthenticated", Kind: Count, Default: MaxUnauthenticated, Min: 1, Max: 1 << 20}
	BodyPeekBound           = Bound{Path: "gateway.body_peek", Kind: Bytes, Default: BodyPeek, Min: 1, Max: 1 << 20}
	RetryBodyBytesBound     = Bound{Path: "gateway.retry_body_bytes", Kind: Bytes, Default: RetryBodyBytes, Min: 0, Max: 16 << 20, Off: true}
)

// Bounds is every Bound, in the order of docs/GATEWAY.md's table of
// limits.
var Bounds = []Bound{
	RetriesBound, ConnectTimeoutBound, ResponseTimeoutBound, FirstByteTimeoutBound,
	RetryAfterBound, DrainTimeoutBound, HandshakeTimeoutBound, HeaderTimeoutBound,
	KeepAliveTimeoutBound, IdleTimeoutBound, MaxConnsBound, AuthFailuresBound,
	MaxHeaderBytesBound, MaxHeaderFieldsBound, MaxUnauthenticatedBound,
	BodyPeekBound, RetryBodyBytesBound,
}

// At is the Path of user i's setting ("gateway.users[2].max_conns");
// Path itself for a setting of the gateway's.
func (b Bound) At(i int) string {
	return strings.Replace(b.Path, "[]", "["+strconv.Itoa(i)+"]", 1)
}

// Format writes v as the file may: a duration as Go writes it without
// its zero tail ("5m", "1h", "1m30s"), bytes and counts as integers.
func (b Bound) Format(v int64) string {
	if b.Kind != Duration {
		return strconv.FormatInt(v, 10)
	}
	s := time.Duration(v).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Fill returns v with the default filled in as gateway.Config reads it:
// 0 is the default; for an Off setting, a negative value is 0.
func (b Bound) Fill(v int64) int64 {
	switch {
	case v == 0:
		return b.Default
	case v < 0 && b.Off:
		return 0
	}
	return v
}

// Check returns an error when v is outside [Min, Max]; it says the value
// and the range, not the Path (the caller's error names it).
func (b Bound) Check(v int64) error {
	if v < b.Min || v > b.Max {
		return fmt.Errorf("%s is out of range [%s, %s]", b.Format(v), b.Format(b.Min), b.Format(b.Max))
	}
	return nil
}

// Setting is a Bound with the field that holds its value (Bind).
type Setting struct {
	Bound
	// Field names the field as an error does: Path, or At(i) for a
	// user's (Setting.At).
	Field string
	get   func() int64
	set   func(int64)
}

// Bind pairs b with the field *p.
func Bind[T ~int | ~int64](b Bound, p *T) Setting {
	return Setting{Bound: b, Field: b.Path,
		get: func() int64 { return int64(*p) },
		set: func(v int64) { *p = T(v) }}
}

// At is s as user i's setting.
func (s Setting) At(i int) Setting {
	s.Field = s.Bound.At(i)
	return s
}

// Value is the field's value.
func (s Setting) Value() int64 { return s.get() }

// Set sets the field's value.
func (s Setting) Set(v int64) { s.set(v) }

// Fill fills the field's default (Bound.Fill).
func (s Setting) Fill() { s.set(s.Bound.Fill(s.get())) }

// Check checks the field's value (Bound.Check).
func (s Setting) Check() error { return s.Bound.Check(s.get()) }

// FirstByteDefault is first_byte_timeout's default under a
// response_timeout: FirstByteTimeout, or the response_timeout if shorter.
func FirstByteDefault(response time.Duration) time.Duration {
	return min(FirstByteTimeout, response)
}

// CheckFirstByte checks first_byte_timeout against FirstByteTimeoutBound
// and a response_timeout: at least MinFirstByteTimeout (or the
// response_timeout if shorter), at most the response_timeout.
func CheckFirstByte(firstByte, response time.Duration) error {
	b := FirstByteTimeoutBound
	b.Min = min(b.Min, int64(response))
	if err := b.Check(int64(firstByte)); err != nil {
		return err
	}
	if firstByte > response {
		return fmt.Errorf("%s is longer than gateway.response_timeout %s", firstByte, response)
	}
	return nil
}
