package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/bans"
	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// AddBan asks health to store a ban (req.Op and req.V are set here; an
// empty Source is "cli") and returns it as stored. A request refused is
// a *messages.FieldError naming the field (validated here first, as
// health will).
func (c *Client) AddBan(ctx context.Context, req bans.Request) (bans.Ban, error) {
	reply, err := c.askBan(ctx, req.Add(bans.SourceCLI, ""))
	if err != nil {
		return bans.Ban{}, err
	}
	b, err := reply.Stored()
	if err != nil {
		return bans.Ban{}, fmt.Errorf("ban: %w", err)
	}
	return b, nil
}

// RemoveBan asks health to lift the ban of address for the site of host.
// Lifting a ban that does not exist is no error.
func (c *Client) RemoveBan(ctx context.Context, address, host string) error {
	_, err := c.askBan(ctx, bans.Request{V: messages.Version, Op: bans.OpRemove, Address: address, Site: host})
	return err
}

func (c *Client) askBan(ctx context.Context, req bans.Request) (bans.Reply, error) {
	body, _, err := req.Encode()
	if err != nil {
		return bans.Reply{}, fmt.Errorf("ban: %w", err)
	}
	return rotation.AskBan(ctx, c.nc, c.subj, body)
}

// BanFilter narrows Bans: to one site (any host, narrowed to its site)
// and, or, one address. The zero BanFilter lists every ban.
type BanFilter struct {
	Site, Address string
}

// Bans reads the active bans in PROXY_BANS that f matches, sorted by
// site, then address. Entries that are not valid bans, and bans over
// whose expiry the bucket has not applied yet, are left out.
func (c *Client) Bans(ctx context.Context, f BanFilter) ([]bans.Ban, error) {
	filter, err := f.keys()
	if err != nil {
		return nil, err
	}
	kv, err := c.bucket(ctx, messages.BucketBans)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []bans.Ban
	err = readKeys(ctx, kv, filter, func(e jetstream.KeyValueEntry) error {
		b, err := bans.DecodeBan(e.Value())
		if err == nil && b.Key() == e.Key() && now.Before(b.Until) {
			out = append(out, b)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketBans, err)
	}
	slices.SortFunc(out, func(a, b bans.Ban) int {
		return cmp.Or(cmp.Compare(a.Site, b.Site), a.Addr().Compare(b.Addr()))
	})
	return out, nil
}

// keys is the key filter of f, its site and address validated.
func (f BanFilter) keys() (string, error) {
	var site, addr string
	if f.Site != "" {
		s, err := bans.Site(f.Site)
		if err != nil {
			return "", fmt.Errorf("ban filter: site: %w", err)
		}
		site = s
	}
	if f.Address != "" {
		a, err := bans.ParseAddr(f.Address)
		if err != nil {
			return "", fmt.Errorf("ban filter: address: %w", err)
		}
		if site != "" {
			return bans.Key(a, site), nil
		}
		addr = bans.AddrFilter(a)
	}
	switch {
	case addr != "":
		return addr, nil
	case site != "":
		return bans.SiteFilter(site), nil
	}
	return ">", nil
}
