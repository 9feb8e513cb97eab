// Package jsapi is proxyfleet's one seam to JetStream's wire API, for the
// requests nats.go's jetstream package makes no call for at the cost the
// worker can bear: a read of a key through its stream's leader, a batched
// direct get of the last message of many subjects, and the pull requests
// that hold a consumer's pin. Every JetStream API subject and key-value
// subject the project's code builds is built here (a test in
// internal/importrules fails on one spelled elsewhere, tests that watch
// the API's traffic aside).
//
// Headers are decoded by nats.go, a deleted key is told by its KV-Operation
// header or its Nats-Marker-Reason marker, and the server's refusals come
// back as *jetstream.APIError, matched with errors.Is against nats.go's
// errors (jetstream.ErrMsgNotFound) or errors.As by code.
//
// StopWatcher stops a key watch without waiting on a server that is gone.
//
// An API is a value made from a jetstream.JetStream: it holds the
// connection and the API prefix (the default, a domain's or a custom one)
// and, under the default prefix, allocates nothing, so it may be made for
// each call.
package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxBatch is the most subjects LastOfEach asks for in one request: the
// server answers at most 1,024 and refuses a request that matches more.
const MaxBatch = 256

// API makes JetStream API requests on one connection.
type API struct {
	js      jetstream.JetStream
	nc      *nats.Conn
	prefix  string        // ends with "."
	timeout time.Duration // a request's bound when its context has none shorter
}

// New returns the API of js: its connection, its API prefix and its
// default request timeout.
func New(js jetstream.JetStream) API {
	o := js.Options()
	return API{js: js, nc: js.Conn(), prefix: prefixOf(o), timeout: o.DefaultTimeout}
}

// Prefix is the subject prefix of the API requests of js, ending with a
// dot: "$JS.API." by default.
func Prefix(js jetstream.JetStream) string { return prefixOf(js.Options()) }

func prefixOf(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// Subjects of API requests under the default prefix, for checks of a
// user's permissions (what such a user must be allowed to publish).

// StreamInfoSubject is the subject of a request for stream's info.
func StreamInfoSubject(stream string) string {
	return jetstream.DefaultAPIPrefix + "STREAM.INFO." + stream
}

// DirectGetLastSubject is the subject of a direct get of subject's last
// message in stream.
func DirectGetLastSubject(stream, subject string) string {
	return jetstream.DefaultAPIPrefix + "DIRECT.GET." + stream + "." + subject
}

// ConsumerCreateSubject is the subject of a request creating consumer on
// stream with filter.
func ConsumerCreateSubject(stream, consumer, filter string) string {
	return jetstream.DefaultAPIPrefix + "CONSUMER.CREATE." + stream + "." + consumer + "." + filter
}

// NextSubjects is the pattern of the pull requests of every consumer of
// stream.
func NextSubjects(stream string) string {
	return jetstream.DefaultAPIPrefix + "CONSUMER.MSG.NEXT." + stream + ".>"
}

// Key-value buckets as JetStream keeps them: a stream per bucket, a subject
// per key.

// KeySubject is the subject of key in bucket.
func KeySubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// KeysFilter is the subject filter of every key of bucket.
func KeysFilter(bucket string) string { return "$KV." + bucket + ".>" }

// KeyOf is the key of subject in bucket, false when subject is not one of
// bucket's.
func KeyOf(bucket, subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, "$KV.")
	if !ok {
		return "", false
	}
	rest, ok = strings.CutPrefix(rest, bucket)
	if !ok {
		return "", false
	}
	if key, ok := strings.CutPrefix(rest, "."); ok {
		return key, true
	}
	return "", false
}

// BucketStream is the name of the stream behind bucket.
func BucketStream(bucket string) string { return "KV_" + bucket }

// Deleted reports whether a key's message with headers hdr marks the key
// deleted or purged: a KV-Operation of DEL or PURGE, or a marker the server
// left (Nats-Marker-Reason: a purge, a removal, or the key's age past the
// bucket's limit).
func Deleted(hdr nats.Header) bool {
	if len(hdr) == 0 {
		return false
	}
	switch hdr.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	return hdr.Get(jetstream.MarkerReasonHeader) != ""
}

// bound is ctx with the API's timeout unless ctx ends sooner.
func (a API) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.timeout)
}

// msgGetResponse is the answer to STREAM.MSG.GET.
type msgGetResponse struct {
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Hdrs    []byte    `json:"hdrs"`
		Data    []byte    `json:"data"`
		Time    time.Time `json:"time"`
	} `json:"message"`
	Error *jetstream.APIError `json:"error"`
}

// LastFromLeader reads the last message of subject in stream through the
// stream's leader (STREAM.MSG.GET), never a replica that may be behind. No
// such message is a *jetstream.APIError with code
// jetstream.JSErrCodeMessageNotFound (errors.Is jetstream.ErrMsgNotFound);
// another refusal is a *jetstream.APIError too; a request unanswered is
// the connection's error.
func (a API) LastFromLeader(ctx context.Context, stream, subject string) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.bound(ctx)
	defer cancel()
	msg, err := a.nc.RequestWithContext(ctx, a.prefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("get from %s: %w", stream, err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("get from %s: decode the answer: %w", stream, err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("get from %s: an answer with no message", stream)
	}
	raw := &jetstream.RawStreamMsg{
		Subject:  resp.Message.Subject,
		Sequence: resp.Message.Seq,
		Data:     resp.Message.Data,
		Time:     resp.Message.Time,
	}
	if len(resp.Message.Hdrs) > 0 {
		if raw.Header, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fmt.Errorf("get from %s: decode the headers: %w", stream, err)
		}
	}
	return raw, nil
}

// KeyFromLeader reads key's value in bucket through the bucket stream's
// leader, and its revision. A key with no value is jetstream.ErrKeyNotFound,
// one deleted or purged jetstream.ErrKeyDeleted.
func (a API) KeyFromLeader(ctx context.Context, bucket, key string) ([]byte, uint64, error) {
	m, err := a.LastFromLeader(ctx, BucketStream(bucket), KeySubject(bucket, key))
	if IsCode(err, jetstream.JSErrCodeMessageNotFound) {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	if Deleted(m.Header) {
		return nil, m.Sequence, jetstream.ErrKeyDeleted
	}
	return m.Data, m.Sequence, nil
}

// IsCode reports whether err is a *jetstream.APIError (or carries one)
// with code.
func IsCode(err error, code jetstream.ErrorCode) bool {
	if err == nil {
		return false
	}
	return (&jetstream.APIError{ErrorCode: code}).Is(err)
}

// LastOfEach asks stream for the last message of each of subjects, in one
// direct get (multi_last, nats-server 2.11+) for each MaxBatch of them,
// and calls fn with each one's subject, headers and body, in the order the
// server sends them. Subjects with no message are left out; none at all is
// no error. A status other than the end of a batch or "none" is a
// *jetstream.APIError whose Code is the status.
//
// Each request subscribes an inbox of its own with a channel that holds
// what it can be answered with (a message a subject, and the end), not
// nats.go's default of 65,536 messages: a batched get is made often, and
// that default would be most of what a worker allocates.
func (a API) LastOfEach(ctx context.Context, stream string, subjects []string, fn func(subject string, hdr nats.Header, data []byte)) error {
	for from := 0; from < len(subjects); from += MaxBatch {
		if err := a.lastOfBatch(ctx, stream, subjects[from:min(from+MaxBatch, len(subjects))], fn); err != nil {
			return err
		}
	}
	return nil
}

func (a API) lastOfBatch(ctx context.Context, stream string, subjects []string, fn func(subject string, hdr nats.Header, data []byte)) error {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return err
	}
	inbox := a.nc.NewRespInbox()
	ch := make(chan *nats.Msg, len(subjects)+1)
	sub, err := a.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return fmt.Errorf("direct get from %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := a.nc.PublishRequest(a.prefix+"DIRECT.GET."+stream, inbox, req); err != nil {
		return fmt.Errorf("direct get from %s: %w", stream, err)
	}
	ctx, cancel := a.bound(ctx)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("direct get from %s: %w", stream, ctx.Err())
		case m := <-ch:
			if len(m.Data) == 0 {
				if status := m.Header.Get(statusHeader); status != "" {
					switch status {
					case "204", "404": // the end of the batch; none has a message
						return nil
					}
					code, _ := strconv.Atoi(status)
					return fmt.Errorf("direct get from %s: %w", stream,
						&jetstream.APIError{Code: code, Description: m.Header.Get(descriptionHeader)})
				}
			}
			subject := m.Header.Get(jetstream.SubjectHeader)
			if subject == "" {
				return fmt.Errorf("direct get from %s: an answer with no subject header", stream)
			}
			fn(subject, m.Header, m.Data)
		}
	}
}

// LastOfKeys is LastOfEach over the keys of bucket that items have (key
// of each), without a slice of them: fn has each key that has a message,
// its value, and whether the message marks it deleted (see Deleted).
func LastOfKeys[T any](ctx context.Context, a API, bucket string, items []T, key func(T) string, fn func(key string, value []byte, deleted bool)) error {
	subjects := make([]string, len(items))
	for i, it := range items {
		subjects[i] = KeySubject(bucket, key(it))
	}
	return a.LastOfEach(ctx, BucketStream(bucket), subjects, func(subject string, hdr nats.Header, data []byte) {
		if key, ok := KeyOf(bucket, subject); ok {
			fn(key, data, Deleted(hdr))
		}
	})
}

// Keys returns the keys of bucket that its stream holds a message of (a
// deleted key's marker too), read from the stream's info.
func (a API) Keys(ctx context.Context, bucket string) ([]string, error) {
	st, err := a.js.Stream(ctx, BucketStream(bucket))
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(KeysFilter(bucket)))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		if key, ok := KeyOf(bucket, subject); ok {
			keys = append(keys, key)
		}
	}
	return keys, nil
}

// The headers in which the server answers a request with a status and
// no message (nats.go does not export its names).
const (
	statusHeader      = "Status"
	descriptionHeader = "Description"
)

// holdRequest is a pull request that renews pin and can take no message
// (max_bytes 1 is less than any message), answered at once.
type holdRequest struct {
	Batch    int    `json:"batch"`
	MaxBytes int    `json:"max_bytes"`
	NoWait   bool   `json:"no_wait"`
	Group    string `json:"group"`
	ID       string `json:"id"`
}

// PinHold renews a consumer's pin (see HoldPin).
type PinHold struct {
	nc      *nats.Conn
	sub     *nats.Subscription
	subject string
	inbox   string
	req     []byte
}

// HoldPin prepares the pull requests that renew pin, the pin of consumer
// of stream in priority group, taking no message: each Renew sends one.
// lost is called (from nats.go's goroutine, possibly more than once) when
// the server answers that pin is not, or no longer, the consumer's
// (status 423).
func (a API) HoldPin(stream, consumer, group, pin string, lost func()) (*PinHold, error) {
	req, err := json.Marshal(holdRequest{Batch: 1, MaxBytes: 1, NoWait: true, Group: group, ID: pin})
	if err != nil {
		return nil, err
	}
	inbox := a.nc.NewInbox()
	sub, err := a.nc.Subscribe(inbox, func(m *nats.Msg) {
		if m.Header.Get(statusHeader) == "423" {
			lost()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("hold the pin of %s on %s: %w", consumer, stream, err)
	}
	return &PinHold{nc: a.nc, sub: sub, subject: a.prefix + "CONSUMER.MSG.NEXT." + stream + "." + consumer, inbox: inbox, req: req}, nil
}

// Renew sends one request that renews the pin; the server's answer comes
// to lost only if the pin is lost.
func (h *PinHold) Renew() error { return h.nc.PublishRequest(h.subject, h.inbox, h.req) }

// Stop ends the hold, unsubscribing its inbox.
func (h *PinHold) Stop() error { return h.sub.Unsubscribe() }

// StopWatcher stops kw, a KV watcher made on a context its caller cancels
// once it returns. While nc is connected it stops it now, which deletes
// the watch's consumer at once; while nc is not, it leaves the watcher to
// that context's end: a stop waits for the server to answer the deletion,
// up to JetStream's request timeout (5s), which a caller whose stop must
// fit a bound cannot spare. nats.go then unsubscribes on its own, and the
// consumer, ephemeral, goes with its inactivity threshold if nobody
// deletes it.
func StopWatcher(nc *nats.Conn, kw jetstream.KeyWatcher) {
	if nc.Status() == nats.CONNECTED {
		_ = kw.Stop()
	}
}
