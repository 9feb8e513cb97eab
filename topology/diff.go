package topology

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// field is one setting of a config of type C that we manage.
type field[C any] struct {
	name string
	show func(*C) string
	set  func(dst, want *C)
	// manage reports whether the setting is ours to compare for this
	// config; nil means always.
	manage func(want *C) bool
}

type fieldDiff[C any] struct {
	f field[C]
	d Diff
}

func diffConfig[C any](fields []field[C], have, want *C) []fieldDiff[C] {
	var out []fieldDiff[C]
	for _, f := range fields {
		if f.manage != nil && !f.manage(want) {
			continue
		}
		if h, w := f.show(have), f.show(want); h != w {
			out = append(out, fieldDiff[C]{f, Diff{f.name, h, w}})
		}
	}
	return out
}

// DiffStream lists the settings of stream have that set-up manages and
// that differ from want.
func DiffStream(have, want jetstream.StreamConfig) []Diff {
	return diffsOf(diffConfig(streamFields, &have, &want))
}

// DiffBucket lists the settings of have, the stream behind a bucket, that
// set-up manages and that differ from want (see BucketStreamConfig),
// named as a bucket's (history, ttl...).
func DiffBucket(have, want jetstream.StreamConfig) []Diff {
	return diffsOf(diffConfig(bucketFields, &have, &want))
}

func diffsOf[C any](fds []fieldDiff[C]) []Diff {
	out := make([]Diff, len(fds))
	for i, fd := range fds {
		out[i] = fd.d
	}
	return out
}

// applyDiffs applies every diff at once through try; if the server refuses,
// it tries each alone, so that what it accepts is applied and what it
// refuses is named.
func applyDiffs[C any](fds []fieldDiff[C], try func([]fieldDiff[C]) error) (applied, refused []Diff, err error) {
	if len(fds) == 0 {
		return nil, nil, nil
	}
	if err := try(fds); err == nil {
		return diffsOf(fds), nil, nil
	} else if len(fds) == 1 {
		return nil, diffsOf(fds), err
	}
	for _, fd := range fds {
		if e := try([]fieldDiff[C]{fd}); e != nil {
			refused = append(refused, fd.d)
			if err == nil {
				err = e
			}
		} else {
			applied = append(applied, fd.d)
		}
	}
	return applied, refused, err
}

func showDur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

func showLimit(n int64) string {
	if n <= 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}

var streamFields = []field[jetstream.StreamConfig]{
	{name: "subjects",
		show: func(c *jetstream.StreamConfig) string {
			s := slices.Clone(c.Subjects)
			slices.Sort(s)
			return "[" + strings.Join(s, " ") + "]"
		},
		set: func(d, w *jetstream.StreamConfig) { d.Subjects = w.Subjects }},
	{name: "retention",
		show: func(c *jetstream.StreamConfig) string { return c.Retention.String() },
		set:  func(d, w *jetstream.StreamConfig) { d.Retention = w.Retention }},
	{name: "storage",
		show: func(c *jetstream.StreamConfig) string { return c.Storage.String() },
		set:  func(d, w *jetstream.StreamConfig) { d.Storage = w.Storage }},
	{name: "replicas",
		show: func(c *jetstream.StreamConfig) string { return fmt.Sprint(max(c.Replicas, 1)) },
		set:  func(d, w *jetstream.StreamConfig) { d.Replicas = w.Replicas }},
	{name: "max_age",
		show: func(c *jetstream.StreamConfig) string {
			if c.MaxAge == 0 {
				return "unlimited"
			}
			return c.MaxAge.String()
		},
		set: func(d, w *jetstream.StreamConfig) {
			d.MaxAge = w.MaxAge
			if d.MaxAge > 0 && d.Duplicates > d.MaxAge {
				d.Duplicates = d.MaxAge
			}
		}},
	{name: "duplicate_window",
		show:   func(c *jetstream.StreamConfig) string { return showDur(c.Duplicates) },
		set:    func(d, w *jetstream.StreamConfig) { d.Duplicates = w.Duplicates },
		manage: func(w *jetstream.StreamConfig) bool { return w.Duplicates != 0 }},
	{name: "max_msg_size",
		show:   func(c *jetstream.StreamConfig) string { return showLimit(int64(c.MaxMsgSize)) },
		set:    func(d, w *jetstream.StreamConfig) { d.MaxMsgSize = w.MaxMsgSize },
		manage: func(w *jetstream.StreamConfig) bool { return w.MaxMsgSize != 0 }},
	{name: "max_msgs_per_subject",
		show:   func(c *jetstream.StreamConfig) string { return showLimit(c.MaxMsgsPerSubject) },
		set:    func(d, w *jetstream.StreamConfig) { d.MaxMsgsPerSubject = w.MaxMsgsPerSubject },
		manage: func(w *jetstream.StreamConfig) bool { return w.MaxMsgsPerSubject != 0 }},
	{name: "discard",
		show: func(c *jetstream.StreamConfig) string { return c.Discard.String() },
		set:  func(d, w *jetstream.StreamConfig) { d.Discard = w.Discard }},
	{name: "allow_msg_ttl",
		show:   func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.AllowMsgTTL) },
		set:    func(d, w *jetstream.StreamConfig) { d.AllowMsgTTL = w.AllowMsgTTL },
		manage: func(w *jetstream.StreamConfig) bool { return w.AllowMsgTTL }},
	{name: "allow_direct",
		show:   func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.AllowDirect) },
		set:    func(d, w *jetstream.StreamConfig) { d.AllowDirect = w.AllowDirect },
		manage: func(w *jetstream.StreamConfig) bool { return w.AllowDirect }},
}

// bucketFields are the settings of a bucket we manage, on the stream
// behind it: history is max_msgs_per_subject, ttl is max_age.
var bucketFields = []field[jetstream.StreamConfig]{
	{name: "history",
		show: func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.MaxMsgsPerSubject) },
		set:  func(d, w *jetstream.StreamConfig) { d.MaxMsgsPerSubject = w.MaxMsgsPerSubject }},
	{name: "ttl",
		show: func(c *jetstream.StreamConfig) string { return showDur(c.MaxAge) },
		set: func(d, w *jetstream.StreamConfig) {
			d.MaxAge = w.MaxAge
			if d.MaxAge > 0 && d.Duplicates > d.MaxAge {
				d.Duplicates = d.MaxAge
			}
		}},
	{name: "storage",
		show: func(c *jetstream.StreamConfig) string { return c.Storage.String() },
		set:  func(d, w *jetstream.StreamConfig) { d.Storage = w.Storage }},
	{name: "replicas",
		show: func(c *jetstream.StreamConfig) string { return fmt.Sprint(max(c.Replicas, 1)) },
		set:  func(d, w *jetstream.StreamConfig) { d.Replicas = w.Replicas }},
	{name: "allow_msg_ttl",
		show:   func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.AllowMsgTTL) },
		set:    func(d, w *jetstream.StreamConfig) { d.AllowMsgTTL = w.AllowMsgTTL },
		manage: func(w *jetstream.StreamConfig) bool { return w.AllowMsgTTL }},
	{name: "limit_marker_ttl",
		show: func(c *jetstream.StreamConfig) string { return showDur(c.SubjectDeleteMarkerTTL) },
		set: func(d, w *jetstream.StreamConfig) {
			d.AllowMsgTTL, d.SubjectDeleteMarkerTTL = d.AllowMsgTTL || w.AllowMsgTTL, w.SubjectDeleteMarkerTTL
		},
		manage: func(w *jetstream.StreamConfig) bool { return w.SubjectDeleteMarkerTTL != 0 }},
}

// BucketStreamConfig is the part of the stream behind bucket kc that
// set-up manages: what DiffBucket compares.
func BucketStreamConfig(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: BucketStream(kc.Bucket), MaxMsgsPerSubject: int64(max(kc.History, 1)),
		MaxAge: kc.TTL, Storage: kc.Storage, Replicas: kc.Replicas,
		AllowMsgTTL: kc.LimitMarkerTTL > 0, SubjectDeleteMarkerTTL: kc.LimitMarkerTTL,
	}
}

var consumerFields = []field[jetstream.ConsumerConfig]{
	{name: "ack_policy",
		show: func(c *jetstream.ConsumerConfig) string { return c.AckPolicy.String() },
		set:  func(d, w *jetstream.ConsumerConfig) { d.AckPolicy = w.AckPolicy }},
	{name: "ack_wait",
		show: func(c *jetstream.ConsumerConfig) string { return showDur(c.AckWait) },
		set:  func(d, w *jetstream.ConsumerConfig) { d.AckWait = w.AckWait }},
	{name: "max_deliver",
		show: func(c *jetstream.ConsumerConfig) string { return showLimit(int64(c.MaxDeliver)) },
		set:  func(d, w *jetstream.ConsumerConfig) { d.MaxDeliver = w.MaxDeliver }},
	{name: "max_ack_pending",
		show: func(c *jetstream.ConsumerConfig) string { return showLimit(int64(c.MaxAckPending)) },
		set:  func(d, w *jetstream.ConsumerConfig) { d.MaxAckPending = w.MaxAckPending }},
	{name: "filter_subject",
		show: func(c *jetstream.ConsumerConfig) string {
			if c.FilterSubject == "" && len(c.FilterSubjects) == 0 {
				return "(none)"
			}
			return strings.Join(append([]string{c.FilterSubject}, c.FilterSubjects...), " ")
		},
		set: func(d, w *jetstream.ConsumerConfig) {
			d.FilterSubject, d.FilterSubjects = w.FilterSubject, w.FilterSubjects
		}},
	{name: "priority_policy",
		show: func(c *jetstream.ConsumerConfig) string { return priorityPolicy(c.PriorityPolicy) },
		set:  func(d, w *jetstream.ConsumerConfig) { d.PriorityPolicy = w.PriorityPolicy }},
	{name: "priority_groups",
		show: func(c *jetstream.ConsumerConfig) string { return "[" + strings.Join(c.PriorityGroups, " ") + "]" },
		set:  func(d, w *jetstream.ConsumerConfig) { d.PriorityGroups = w.PriorityGroups }},
	{name: "priority_timeout",
		show:   func(c *jetstream.ConsumerConfig) string { return showDur(c.PinnedTTL) },
		set:    func(d, w *jetstream.ConsumerConfig) { d.PinnedTTL = w.PinnedTTL },
		manage: func(w *jetstream.ConsumerConfig) bool { return w.PriorityPolicy == jetstream.PriorityPolicyPinned }},
}

func priorityPolicy(p jetstream.PriorityPolicy) string {
	switch p {
	case jetstream.PriorityPolicyNone:
		return "none"
	case jetstream.PriorityPolicyPinned:
		return "pinned_client"
	case jetstream.PriorityPolicyOverflow:
		return "overflow"
	}
	return fmt.Sprint(int(p))
}
