package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"proxyfleet/fleet"
)

// The sources of image artifacts: file:// and http(s):// URLs.
//
// HTTP sources must send a Content-Length: a volume is created with the
// artifact's size before any byte is read, and staging multi-gigabyte images
// on the worker's disk first would cost what the streaming saves. A mirror
// that does not send one is refused (permanent), as is one that compresses
// the body (identity encoding is asked for).

// source is an opened artifact with its size.
type source struct {
	io.ReadCloser
	size int64
}

func sourceKind(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("url %q: %w", raw, err)
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" && u.Host != "localhost" {
			return "", fmt.Errorf("url %q: want file:///absolute/path", raw)
		}
		return "file", nil
	case "http", "https":
		return "http", nil
	}
	return "", fmt.Errorf("url %q: scheme %q is not file, http or https", raw, u.Scheme)
}

// open opens an artifact's source under ctx (the download's deadline):
// reads fail once ctx is done. A wrong URL, a missing file, an HTTP answer
// that will not change on retry, or a missing Content-Length are
// permanent; the network is transient.
func (c *imageCache) open(ctx context.Context, raw string) (*source, error) {
	kind, err := sourceKind(raw)
	if err != nil {
		return nil, fleet.Permanent(err)
	}
	if kind == "file" {
		u, _ := url.Parse(raw)
		f, err := os.Open(u.Path)
		if err != nil {
			return nil, fleet.Permanent(fmt.Errorf("open %s: %w", raw, err))
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fleet.Transient(fmt.Errorf("stat %s: %w", raw, err))
		}
		if !fi.Mode().IsRegular() || fi.Size() == 0 {
			f.Close()
			return nil, fleet.Permanent(fmt.Errorf("%s: not a non-empty regular file", raw))
		}
		return &source{ReadCloser: &ctxReader{ctx: ctx, r: f}, size: fi.Size()}, nil
	}
	hc := c.httpClient
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, fleet.Permanent(fmt.Errorf("get %s: %w", raw, err))
	}
	// A compressed answer would have no usable length; Go's transport
	// decompresses only what it asked for itself.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fleet.Transient(fmt.Errorf("get %s: %w", raw, err))
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		err := fmt.Errorf("get %s: %s", raw, resp.Status)
		switch {
		case resp.StatusCode >= 500, resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests:
			return nil, fleet.Transient(err)
		}
		return nil, fleet.Permanent(err)
	}
	if resp.ContentLength <= 0 {
		resp.Body.Close()
		return nil, fleet.Permanent(fmt.Errorf("get %s: no Content-Length (the cache streams into a volume of the artifact's size; use a mirror that sends one)", raw))
	}
	return &source{ReadCloser: &ctxReader{ctx: ctx, r: resp.Body}, size: resp.ContentLength}, nil
}

// ctxReader fails reads once ctx is done (an HTTP body does that itself;
// a file does not), with the context's error.
type ctxReader struct {
	ctx context.Context
	r   io.ReadCloser
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, fmt.Errorf("deadline: %w", context.Cause(r.ctx))
	}
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.ctx.Err() != nil && !errors.Is(err, r.ctx.Err()) {
		err = fmt.Errorf("%w (%w)", context.Cause(r.ctx), err)
	}
	return n, err
}

func (r *ctxReader) Close() error { return r.r.Close() }
