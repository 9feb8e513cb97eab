package main

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"

	"proxyfleet/config"
	"proxyfleet/messages"
)

const defaultNATSURL = "nats://127.0.0.1:4222"

// natsFlags are the connection flags every command takes, named as the
// nats CLI names them. Each setting comes from the first of: its flag, its
// environment variable (NATS_URL, NATS_CREDS, ...), the nats context
// (--context, NATS_CONTEXT, or the one `nats context select` chose), the
// config file, the default (resolve).
type natsFlags struct {
	natsSettings
	context, prefix string
}

// natsSettings are where and as whom to connect.
type natsSettings struct {
	url, creds, nkey, user, password, token, cert, key, ca string
}

// hiddenFlags are the older names, still accepted, left out of -h.
var hiddenFlags = map[string]bool{"nats-url": true, "tls-ca": true, "tls-cert": true, "tls-key": true, "debug": true}

func (n *natsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.url, "server", "", "NATS server URL(s), comma-separated (env NATS_URL; default "+defaultNATSURL+")")
	fs.StringVar(&n.url, "s", "", "short for --server")
	fs.StringVar(&n.url, "nats-url", "", "same as --server")
	fs.StringVar(&n.context, "context", "", "nats CLI context to connect with (env NATS_CONTEXT; default the selected one)")
	fs.StringVar(&n.creds, "creds", "", "NATS user credentials file (JWT) (env NATS_CREDS)")
	fs.StringVar(&n.nkey, "nkey", "", "NATS nkey seed file (env NATS_NKEY)")
	fs.StringVar(&n.user, "user", "", "NATS user name (env NATS_USER)")
	fs.StringVar(&n.password, "password", "", "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&n.cert, "tlscert", "", "TLS client certificate (env NATS_CERT)")
	fs.StringVar(&n.key, "tlskey", "", "TLS client key (env NATS_KEY)")
	fs.StringVar(&n.ca, "tlsca", "", "CA bundle to verify the NATS server (env NATS_CA)")
	fs.StringVar(&n.cert, "tls-cert", "", "same as --tlscert")
	fs.StringVar(&n.key, "tls-key", "", "same as --tlskey")
	fs.StringVar(&n.ca, "tls-ca", "", "same as --tlsca")
	fs.StringVar(&n.prefix, "prefix", "", "subject prefix (default from config, or \""+messages.DefaultPrefix+"\")")
}

// env is the nats CLI's environment variables.
func envSettings() natsSettings {
	return natsSettings{
		url: os.Getenv("NATS_URL"), creds: os.Getenv("NATS_CREDS"), nkey: os.Getenv("NATS_NKEY"),
		user: os.Getenv("NATS_USER"), password: os.Getenv("NATS_PASSWORD"),
		cert: os.Getenv("NATS_CERT"), key: os.Getenv("NATS_KEY"), ca: os.Getenv("NATS_CA"),
	}
}

// contextSettings loads the nats CLI context named (or, with no name, the
// selected one; none selected is no context).
func contextSettings(name string) (natsSettings, error) {
	if name == "" {
		name = natscontext.SelectedContext()
		if name == "" {
			return natsSettings{}, nil
		}
	}
	nctx, err := natscontext.New(name, true)
	if err != nil {
		return natsSettings{}, fmt.Errorf("nats context %q: %w", name, err)
	}
	s := natsSettings{
		creds: nctx.Creds(), nkey: nctx.NKey(), user: nctx.User(), password: nctx.Password(), token: nctx.Token(),
		cert: nctx.Certificate(), key: nctx.Key(), ca: nctx.CA(),
	}
	// A context without a URL reads as the nats default: leave the URL to
	// the config file then (or to serve's embedded server).
	if u := nctx.ServerURL(); u != nats.DefaultURL {
		s.url = u
	}
	return s, nil
}

func (s natsSettings) hasAuth() bool {
	return s.creds != "" || s.nkey != "" || s.user != "" || s.token != ""
}

// resolve fills each setting left empty by its flag from, in turn, the
// environment, the nats context and c (which may be nil), and puts the
// prefix into c. The URL stays empty if none of them names one (serve then
// runs its embedded server; the others use ensureURL). Credentials and
// client certificates are taken whole from the first source that has any.
func (n *natsFlags) resolve(c *config.Config) error {
	var cfg natsSettings
	if c != nil {
		cfg = natsSettings{url: c.NATS.URL, creds: c.NATS.Creds, cert: c.NATS.TLS.Cert, key: c.NATS.TLS.Key, ca: c.NATS.TLS.CA}
	}
	ctx, err := contextSettings(cmp.Or(n.context, os.Getenv("NATS_CONTEXT")))
	if err != nil {
		return err
	}
	levels := []natsSettings{n.natsSettings, envSettings(), ctx, cfg}
	out := natsSettings{}
	for _, l := range levels {
		out.url = cmp.Or(out.url, l.url)
		out.ca = cmp.Or(out.ca, l.ca)
	}
	for _, l := range levels {
		if l.hasAuth() {
			out.creds, out.nkey, out.user, out.password, out.token = l.creds, l.nkey, l.user, l.password, l.token
			break
		}
	}
	for _, l := range levels {
		if l.cert != "" || l.key != "" {
			out.cert, out.key = l.cert, l.key
			break
		}
	}
	n.natsSettings = out
	if c != nil {
		n.prefix = cmp.Or(n.prefix, c.NATS.Prefix)
		c.NATS.Prefix = n.prefix
	}
	return nil
}

// ensureURL sets the default URL if no source named one.
func (n *natsFlags) ensureURL() {
	n.url = cmp.Or(n.url, defaultNATSURL)
}

// options are the connection's authentication and TLS.
func (n *natsFlags) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case n.creds != "":
		opts = append(opts, nats.UserCredentials(n.creds))
	case n.nkey != "":
		o, err := nats.NkeyOptionFromSeed(n.nkey)
		if err != nil {
			return nil, fmt.Errorf("nkey: %w", err)
		}
		opts = append(opts, o)
	case n.user != "":
		opts = append(opts, nats.UserInfo(n.user, n.password))
	case n.token != "":
		opts = append(opts, nats.Token(n.token))
	}
	if n.ca != "" || n.cert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if n.ca != "" {
			pem, err := os.ReadFile(n.ca)
			if err != nil {
				return nil, fmt.Errorf("read tls ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls ca %s: no certificates", n.ca)
			}
			tc.RootCAs = pool
		}
		if n.cert != "" {
			cert, err := tls.LoadX509KeyPair(n.cert, n.key)
			if err != nil {
				return nil, fmt.Errorf("load tls cert: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// connect connects with the given inbox prefix: each role subscribes to
// replies under its own (see deploy/nats/accounts.conf).
func (n *natsFlags) connect(name, inbox string, log *slog.Logger) (*nats.Conn, error) {
	opts, err := n.options()
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		nats.Name(name),
		nats.CustomInboxPrefix(inbox),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && log != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			if log != nil {
				log.Info("nats reconnected", "url", c.ConnectedUrl())
			}
		}),
	)
	nc, err := nats.Connect(n.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", n.url, err)
	}
	return nc, nil
}
