package nats_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// passwords are the variables accounts.conf reads.
var passwords = []string{"PROXYFLEET_ADMIN_PASSWORD", "PROXYFLEET_CLIENT_PASSWORD", "PROXYFLEET_WORKER_PASSWORD", "PROXYFLEET_HEALTH_PASSWORD", "PROXYFLEET_POOLS_PASSWORD", "NATS_SYS_PASSWORD"}

// roleUsers are the users proxyfleet's roles connect as.
var roleUsers = []string{"admin", "client", "worker", "health", "pools"}

// checkAccounts checks that opts hold accounts.conf's users, each in the
// PROXYFLEET account with permissions, and the system account.
func checkAccounts(t *testing.T, opts *server.Options) {
	t.Helper()
	var got []string
	for _, u := range opts.Users {
		if u.Account == nil || u.Account.Name != "PROXYFLEET" {
			continue
		}
		got = append(got, u.Username)
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Errorf("user %s has no publish and subscribe permissions", u.Username)
		}
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(roleUsers))
	if !slices.Equal(got, want) {
		t.Errorf("users of account PROXYFLEET: %v, want %v", got, want)
	}
	if opts.SystemAccount != "SYS" {
		t.Errorf("system account %q, want SYS", opts.SystemAccount)
	}
}

// TestNATSConf loads the single-node nats.conf with the server's loader.
func TestNATSConf(t *testing.T) {
	opts, err := server.ProcessConfigFile("../../nats.conf")
	if err != nil {
		t.Fatalf("nats.conf: %v", err)
	}
	if !opts.JetStream || !opts.SyncAlways || opts.StoreDir == "" {
		t.Errorf("nats.conf: jetstream %v, sync_interval always %v, store_dir %q: want JetStream synced on every write", opts.JetStream, opts.SyncAlways, opts.StoreDir)
	}
	if opts.Host != "127.0.0.1" || opts.HTTPHost != "127.0.0.1" {
		t.Errorf("nats.conf listens on %s, monitoring on %s: want loopback (it has no users)", opts.Host, opts.HTTPHost)
	}
}

// TestClusterConf loads deploy/nats/cluster.conf (and the accounts.conf it
// includes) with the server's loader. Its TLS files are made for the test
// in a directory of their own, the only change to the file.
func TestClusterConf(t *testing.T) {
	for _, k := range passwords {
		t.Setenv(k, strings.ToLower(k))
	}
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	writeTLS(t, tlsDir, "server", "route")
	b, err := os.ReadFile("cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	const shipped = "/etc/nats/tls/"
	if !strings.Contains(string(b), shipped) {
		t.Fatalf("cluster.conf names no file under %s", shipped)
	}
	conf := filepath.Join(dir, "cluster.conf")
	mustWrite(t, conf, strings.ReplaceAll(string(b), shipped, tlsDir+"/"))
	copyFile(t, "accounts.conf", filepath.Join(dir, "accounts.conf"))
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("cluster.conf: %v", err)
	}
	if !opts.JetStream || opts.Cluster.Name != "proxyfleet" || len(opts.Routes) != 3 {
		t.Errorf("cluster.conf: jetstream %v, cluster %q with %d routes: want JetStream on a named cluster of 3", opts.JetStream, opts.Cluster.Name, len(opts.Routes))
	}
	if opts.TLSConfig == nil || opts.Cluster.TLSConfig == nil {
		t.Error("cluster.conf: no TLS for clients or routes")
	}
	checkAccounts(t, opts)
}

func mustWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, to, string(b))
}

// writeTLS writes ca.pem and, for each name, NAME.pem and NAME-key.pem
// signed by it, into dir.
func writeTLS(t *testing.T, dir string, names ...string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	writePEM := func(name, typ string, der []byte) {
		mustWrite(t, filepath.Join(dir, name), string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})))
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	writePEM("ca.pem", "CERTIFICATE", caDER)
	for i, name := range names {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			DNSNames:  []string{"nats-1", "nats-2", "nats-3", "localhost"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(name+".pem", "CERTIFICATE", der)
		writePEM(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
}
