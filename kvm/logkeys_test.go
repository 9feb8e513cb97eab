package kvm

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// repeatedKey returns a key that a JSON log record names twice at its top
// level, or "".
func repeatedKey(t *testing.T, line []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s", line)
	}
	seen := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if seen[k.(string)] {
			return k.(string)
		}
		seen[k.(string)] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
	}
	return ""
}

// An image upload through a provider whose logger is JSON (as a role's
// is) logs each record's keys once: the provider's logger names the host,
// and the upload's records do not name it again.
func TestImageUploadLogsNameTheHostOnce(t *testing.T) {
	env := testhostAll(t)
	var logs lockedBuffer
	p := newTestProvider(t, env, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.Host.Name = "th-logkeys"
	})
	pool, _ := testPool(t, p.link)
	p.images.pool = pool.Name
	src := t.TempDir()
	diskURL, _, diskSHA := writeArtifact(t, src, "disk.raw", 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := p.images.ensure(ctx, ImageSource{Name: "tiny", URL: diskURL, SHA256: diskSHA, Format: "raw"}); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	uploaded := false
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if k := repeatedKey(t, []byte(line)); k != "" {
			t.Errorf("key %q repeated: %s", k, line)
		}
		if strings.Contains(line, `"msg":"image uploaded, verified and marked"`) {
			uploaded = strings.Contains(line, `"host":"th-logkeys"`)
		}
	}
	if !uploaded {
		t.Errorf("no upload record naming host th-logkeys:\n%s", logs.String())
	}
}
