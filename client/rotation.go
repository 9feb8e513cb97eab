package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// Rotation reads the rotation as the publishing health process has it,
// exactly, at one version (health's), through the rotation's pages and
// feed (rotation.Read: entries whole, with host, labels and egress). When
// no health process answers (none runs, or none holds the lease yet, or
// the request is refused to this user), it reads the KV bucket
// PROXY_ROTATION instead (RotationFromBucket). Proxies are sorted by id.
func (c *Client) Rotation(ctx context.Context) (messages.Rotation, error) {
	rot, err := rotation.Read(ctx, c.nc, c.subj)
	var pe *messages.PageError
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.As(err, &pe),
		errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return c.RotationFromBucket(ctx)
	}
	return rot, err
}

// RotationFromBucket reads the rotation from the KV bucket PROXY_ROTATION
// (key = proxy id, value = ip:port), what the publishing health process
// last wrote there: for when no health process answers. The snapshot's
// Version is the highest revision among the keys (it grows with every
// change, but it is not the health process's own version); each entry's
// Since is when its key was last written; Host, which the bucket does not
// hold, comes from the proxy's latest state event when there is one, and
// Egress from health's record of the proxy in PROXY_CHECKS. Proxies are
// sorted by id.
func (c *Client) RotationFromBucket(ctx context.Context) (messages.Rotation, error) {
	rot := messages.Rotation{V: messages.Version, Proxies: []messages.RotationEntry{}}
	kv, err := c.bucket(ctx, messages.BucketRotation)
	if err != nil {
		return rot, err
	}
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		rot.Proxies = append(rot.Proxies, messages.RotationEntry{
			ID: e.Key(), Addr: string(e.Value()), Since: e.Created().UTC(),
		})
		rot.Version = max(rot.Version, e.Revision())
		return nil
	})
	if err != nil {
		return rot, fmt.Errorf("read %s: %w", messages.BucketRotation, err)
	}
	sort.Slice(rot.Proxies, func(i, j int) bool { return rot.Proxies[i].ID < rot.Proxies[j].ID })
	rot.At = time.Now().UTC()
	if len(rot.Proxies) > 0 {
		// The bucket holds no host; the latest events do. Best effort:
		// the rotation is complete without them.
		if events, err := c.latestEvents(ctx); err == nil {
			for i, p := range rot.Proxies {
				if ev := events[p.ID]; ev != nil {
					rot.Proxies[i].Host = ev.Host
				}
			}
		}
		if checks, err := c.checks(ctx); err == nil {
			for i, p := range rot.Proxies {
				if chk := checks[p.ID]; chk != nil && chk.Addr == p.Addr {
					rot.Proxies[i].Egress = chk.Egress
				}
			}
		}
	}
	return rot, nil
}

// maxRotationBody bounds a snapshot read over HTTP.
const maxRotationBody = 32 << 20

// RotationURL returns the snapshot served by a health process: base is its
// address ("http://host:port", to which /rotation is added, or a full URL
// with a path). hc nil means http.DefaultClient. It needs no NATS.
func RotationURL(ctx context.Context, hc *http.Client, base string) (messages.Rotation, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return messages.Rotation{}, fmt.Errorf("rotation url %q: want http(s)://host:port[/path]", base)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/rotation"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return messages.Rotation{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("get rotation: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return messages.Rotation{}, fmt.Errorf("get %s: %s: %s", u, resp.Status, strings.TrimSpace(string(snippet)))
	}
	var rot messages.Rotation
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxRotationBody))
	if err := dec.Decode(&rot); err != nil {
		return messages.Rotation{}, fmt.Errorf("decode rotation from %s: %w", u, err)
	}
	if rot.Proxies == nil {
		rot.Proxies = []messages.RotationEntry{}
	}
	return rot, nil
}
