package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"proxyfleet/config"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// runCLI runs one command as main does; code is its exit code (an error
// that is no exitError exits 1, its text on stderr as main writes it).
func runCLI(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	err := run(ctx, args[0], args[1:], &o, &e)
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.code
	default:
		code = 1
		e.WriteString("proxyfleet " + args[0] + ": " + err.Error() + "\n")
	}
	return o.String(), e.String(), code
}

// isolateNATSEnv gives the test a HOME and XDG_CONFIG_HOME of its own (no
// nats context of the machine's) and no NATS_* variables, and returns the
// nats CLI's context directory in it.
func isolateNATSEnv(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	for _, k := range []string{"NATS_URL", "NATS_CONTEXT", "NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_CERT", "NATS_KEY", "NATS_CA"} {
		t.Setenv(k, "")
	}
	dir := filepath.Join(home, ".config", "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// operatorServer runs a nats-server in operator (JWT) mode with one
// account, JetStream on, and returns it with a user credentials file of
// that account.
func operatorServer(t *testing.T) (*natstest.Server, string) {
	t.Helper()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "test"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	if oc, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		t.Fatal(err)
	}
	account := func(name string, js bool) (string, string, nkeys.KeyPair) {
		akp, _ := nkeys.CreateAccount()
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		if err != nil {
			t.Fatal(err)
		}
		return apub, ajwt, akp
	}
	spub, sjwt, _ := account("SYS", false)
	apub, ajwt, akp := account("PROXYFLEET", true)
	res := &server.MemAccResolver{}
	if err := res.Store(spub, sjwt); err != nil {
		t.Fatal(err)
	}
	if err := res.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartOpts(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{oc}
		o.AccountResolver = res
		o.SystemAccount = spub
	})
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	ujwt, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	// The topology, as set-up makes it, so that the verbs find it.
	_, js := srv.Connect(t, nats.UserCredentials(path))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := (topology.Topology{Subjects: messages.NewSubjects("")}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	return srv, path
}

// writeContext writes a nats CLI context file, as `nats context save`
// does, into dir.
func writeContext(t *testing.T, dir, name string, fields map[string]string) {
	t.Helper()
	b, _ := json.Marshal(fields)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestConnectLikeTheNATSCLI: against a real server that requires JWT
// credentials, a client verb connects with NATS_URL, with --creds, and with
// a nats CLI context (named by --context, by NATS_CONTEXT, or selected),
// and the sources rank as in the nats CLI: flag, environment, context,
// config file. Without credentials the server refuses, so each success is
// the credentials' doing.
func TestConnectLikeTheNATSCLI(t *testing.T) {
	ctxDir := isolateNATSEnv(t)
	srv, creds := operatorServer(t)
	url := srv.ClientURL()
	dead := "nats://127.0.0.1:1" // nothing listens there
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	list := func(what string, wantOK bool, args ...string) {
		t.Helper()
		o, e, code := runCLI(ctx, append([]string{"list", "--timeout", "5s"}, args...)...)
		if (code == 0) != wantOK || wantOK && !strings.HasPrefix(o, "ID  ") {
			t.Errorf("%s: exit %d, want success %v\nstdout: %s\nstderr: %s", what, code, wantOK, o, e)
		}
	}

	list("no credentials", false, "--server", url)
	list("--server and --creds", true, "--server", url, "--creds", creds)
	list("-s and --creds", true, "-s", url, "--creds", creds)

	t.Setenv("NATS_URL", url)
	list("NATS_URL and --creds", true, "--creds", creds)
	t.Setenv("NATS_CREDS", creds)
	list("NATS_URL and NATS_CREDS", true)
	list("--server beats NATS_URL", false, "--server", dead)
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CREDS", "")

	writeContext(t, ctxDir, "pf", map[string]string{"url": url, "creds": creds, "description": "proxyfleet test"})
	writeContext(t, ctxDir, "elsewhere", map[string]string{"url": dead, "creds": creds})
	list("--context", true, "--context", "pf")
	list("--context naming a dead server", false, "--context", "elsewhere")
	list("--server beats the context", true, "--context", "elsewhere", "--server", url)
	t.Setenv("NATS_URL", url)
	list("NATS_URL beats the context", true, "--context", "elsewhere")
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CONTEXT", "pf")
	list("NATS_CONTEXT", true)
	t.Setenv("NATS_CONTEXT", "")
	if err := os.WriteFile(filepath.Join(filepath.Dir(ctxDir), "context.txt"), []byte("pf"), 0o600); err != nil {
		t.Fatal(err)
	}
	list("the selected context", true)
	list("--context beats the selected one", false, "--context", "elsewhere")

	// The config file ranks below the context.
	cfg := filepath.Join(t.TempDir(), "client.yaml")
	writeFile(t, cfg, "nats: {url: \""+dead+"\", creds: \""+creds+"\"}\nhosts:\n  - {name: h1, driver: sim, sim: {dir: /nonexistent}}\n")
	list("the context beats the config file", true, "--config", cfg)
	if err := os.Remove(filepath.Join(filepath.Dir(ctxDir), "context.txt")); err != nil {
		t.Fatal(err)
	}
	list("the config file without a context", false, "--config", cfg)
	list("--server beats the config file", true, "--config", cfg, "--server", url)

	_, e, code := runCLI(ctx, "list", "--context", "nosuch")
	if code != 1 || !strings.Contains(e, `nats context "nosuch"`) {
		t.Errorf("an unknown context: exit %d, %q", code, e)
	}
}

// TestConnectWithUserAndNkey: --user/--password (and NATS_USER and
// NATS_PASSWORD) and --nkey connect to a server that requires them.
func TestConnectWithUserAndNkey(t *testing.T) {
	isolateNATSEnv(t)
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	seed, _ := ukp.Seed()
	seedPath := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedPath, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartOpts(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "op", Password: "secret"}}
		o.Nkeys = []*server.NkeyUser{{Nkey: upub}}
	})
	_, js := srv.Connect(t, nats.UserInfo("op", "secret"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := (topology.Topology{Subjects: messages.NewSubjects("")}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		ok   bool
		args []string
	}{
		{"no credentials", false, nil},
		{"a wrong password", false, []string{"--user", "op", "--password", "wrong"}},
		{"--user and --password", true, []string{"--user", "op", "--password", "secret"}},
		{"--nkey", true, []string{"--nkey", seedPath}},
	} {
		o, e, code := runCLI(ctx, append([]string{"hosts", "--timeout", "5s", "--server", srv.ClientURL()}, c.args...)...)
		if (code == 0) != c.ok {
			t.Errorf("%s: exit %d, want success %v\nstdout: %s\nstderr: %s", c.what, code, c.ok, o, e)
		}
	}
	t.Setenv("NATS_USER", "op")
	t.Setenv("NATS_PASSWORD", "secret")
	if o, e, code := runCLI(ctx, "hosts", "--timeout", "5s", "--server", srv.ClientURL()); code != 0 {
		t.Errorf("NATS_USER and NATS_PASSWORD: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
}

// TestPrefixFromFlagOrConfig: --prefix wins over the config file's, and
// the config every role builds its subjects from carries the winner, so
// serve, worker, health and setup honour the flag.
func TestPrefixFromFlagOrConfig(t *testing.T) {
	isolateNATSEnv(t)
	for _, c := range []struct{ flag, cfg, want string }{{"flagp", "cfgp", "flagp"}, {"", "cfgp", "cfgp"}, {"flagp", "", "flagp"}, {"", "", ""}} {
		cfg := &config.Config{NATS: config.NATS{Prefix: c.cfg}}
		nf := natsFlags{prefix: c.flag}
		if err := nf.resolve(cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.NATS.Prefix != c.want || nf.prefix != c.want {
			t.Errorf("--prefix %q, config %q: config has %q, flags %q; want %q", c.flag, c.cfg, cfg.NATS.Prefix, nf.prefix, c.want)
		}
	}
}

// TestServeAndWorkerNeedConfig: their usage says --config is required,
// and without it they say so and exit 1 before doing anything.
func TestServeAndWorkerNeedConfig(t *testing.T) {
	isolateNATSEnv(t)
	for _, role := range []string{"serve", "worker"} {
		o, _, _ := runCLI(context.Background(), role, "--help")
		if !strings.HasPrefix(o, "Usage: proxyfleet "+role+" --config F [flags]\n") || !strings.Contains(usage, "\n  proxyfleet "+role+" ") ||
			!strings.Contains(usage, role+"   --config F") && !strings.Contains(usage, role+"    --config F") {
			t.Errorf("%s: usage does not say --config is required:\n%s", role, o)
		}
		o, e, code := runCLI(context.Background(), role, "--id", "w1")
		if code != 1 || o != "" || e != "proxyfleet "+role+": --config is required\n" {
			t.Errorf("%s without --config: exit %d\nstdout: %s\nstderr: %s", role, code, o, e)
		}
	}
}

// writeCert writes a certificate (signed by parent, or self-signed when
// parent is nil) and its key as PEM files in dir, and returns them.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (certPath, keyPath string, cert *x509.Certificate, key *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writeFile(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	return certPath, keyPath, cert, key
}

// TestConnectWithTLS: against a server that verifies client certificates,
// --tlsca, --tlscert and --tlskey connect, as do NATS_CA, NATS_CERT and
// NATS_KEY, and a context's ca, cert and key; without the client
// certificate the server refuses.
func TestConnectWithTLS(t *testing.T) {
	ctxDir := isolateNATSEnv(t)
	dir := t.TempDir()
	now := time.Now()
	caPath, _, ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
	srvCert, srvKey, _, _ := writeCert(t, dir, "server", &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, caKey)
	cliCert, cliKey, _, _ := writeCert(t, dir, "client", &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "operator"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, caKey)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srvCert, KeyFile: srvKey, CaFile: caPath, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartOpts(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, tc, 5
	})
	url := "tls://" + srv.Addr().String()
	_, js := srv.Connect(t, nats.RootCAs(caPath), nats.ClientCert(cliCert, cliKey))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := (topology.Topology{Subjects: messages.NewSubjects("")}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	list := func(what string, wantOK bool, args ...string) {
		t.Helper()
		o, e, code := runCLI(ctx, append([]string{"list", "--timeout", "5s"}, args...)...)
		if (code == 0) != wantOK {
			t.Errorf("%s: exit %d, want success %v\nstdout: %s\nstderr: %s", what, code, wantOK, o, e)
		}
	}
	list("the CA only", false, "--server", url, "--tlsca", caPath)
	list("--tlsca, --tlscert, --tlskey", true, "--server", url, "--tlsca", caPath, "--tlscert", cliCert, "--tlskey", cliKey)
	t.Setenv("NATS_CA", caPath)
	t.Setenv("NATS_CERT", cliCert)
	t.Setenv("NATS_KEY", cliKey)
	list("NATS_CA, NATS_CERT, NATS_KEY", true, "--server", url)
	t.Setenv("NATS_CA", "")
	t.Setenv("NATS_CERT", "")
	t.Setenv("NATS_KEY", "")
	writeContext(t, ctxDir, "tls", map[string]string{"url": url, "ca": caPath, "cert": cliCert, "key": cliKey})
	list("a context with ca, cert and key", true, "--context", "tls")
}
