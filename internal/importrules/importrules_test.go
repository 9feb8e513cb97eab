package importrules

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "proxyfleet"

// Families of outside packages, by import path prefix.
var (
	natsPkgs    = []string{"github.com/nats-io/"}
	libvirtPkgs = []string{"github.com/digitalocean/go-libvirt", "libvirt.org/"}
	sshPkgs     = []string{"golang.org/x/crypto/ssh"}
)

// rule is what one package may depend on, directly or not: of proxyfleet,
// only the packages in allow (and its own subpackages); of the outside
// world, nothing under forbid. Every package with a rule has a row in the
// map of docs/ARCHITECTURE.md that names the same allow list.
type rule struct {
	pkg    string // relative to the module
	allow  []string
	forbid [][]string
}

var rules = []rule{
	// The contract has one home and any client can be checked against it.
	{pkg: "messages", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "fleet", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// The destinations refused are one list, read alike by the config,
	// the gateway and the guests' configuration: pure, it leans on nothing.
	{pkg: "deny", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// Bans and rules are pure decisions the config, the followers of the
	// rotation and health all read: they lean on the contract only.
	{pkg: "bans", allow: []string{"messages"}, forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// It takes the roles' defaults from their pure constants, never from
	// the roles themselves.
	{pkg: "config", allow: []string{"messages", "addrplan", "fleet", "deny", "bans", "console/defaults", "worker/defaults", "topology/defaults", "health/defaults", "pool/defaults", "gateway/defaults", "rotation/defaults"}, forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "worker/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "topology/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "health/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "pool/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "gateway/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "rotation/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	{pkg: "console/defaults", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// Address plans and their assignments are pure decisions: the worker
	// and the config both lean on them, and they on nothing that runs.
	{pkg: "addrplan", allow: []string{"fleet", "messages"}, forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// A library for libvirt over SSH, not shaped by one YAML schema nor by
	// the worker that drives it.
	{pkg: "kvm", allow: []string{"fleet", "messages", "deny"}, forbid: [][]string{natsPkgs}},
	{pkg: "sim", allow: []string{"fleet", "messages"}, forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// JetStream's wire API has one home, which leans on nats.go alone.
	{pkg: "internal/jsapi", forbid: [][]string{libvirtPkgs, sshPkgs}},
	// The lease one replica of a role holds to act leans on the contract
	// and nats.go alone, so every role that elects one shares it.
	{pkg: "internal/lease", allow: []string{"messages"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// Set-up and repair serve every role, so they lean on none of them.
	{pkg: "topology", allow: []string{"messages", "internal/jsapi"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// Hosts reach the worker as Providers, never as a driver it imports.
	{pkg: "worker", allow: []string{"addrplan", "fleet", "messages", "topology", "topology/defaults", "internal/jsapi"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// Sharing the hosts lies below the worker: it reaches the worker's
	// consumers only through the Host it declares, never the worker.
	{pkg: "worker/hostshare", allow: []string{"messages", "topology", "topology/defaults", "internal/jsapi"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	{pkg: "health", allow: []string{"messages", "bans", "internal/jsapi", "internal/lease"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// A client reads the contract, and the rotation through its library,
	// never the worker's insides.
	{pkg: "client", allow: []string{"messages", "rotation", "rotation/defaults", "internal/jsapi", "bans"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// A program that uses the fleet needs the contract and NATS, nothing
	// of how the fleet is run.
	{pkg: "rotation", allow: []string{"messages", "bans"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// HTTP/1.1 framing has one home, under the gateway's decisions: it
	// knows no user, proxy or ban.
	{pkg: "gateway/h1", forbid: [][]string{natsPkgs, libvirtPkgs, sshPkgs}},
	// The clients' one address: it reads the rotation through a Picker
	// it declares (package rotation implements it), never health's or
	// the worker's insides.
	{pkg: "gateway", allow: []string{"messages", "rotation", "rotation/defaults", "deny", "bans", "gateway/h1"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// The pool controller keeps pools by the commands any client may
	// send, reading the rotation through its library: nothing of the
	// worker's or health's insides.
	{pkg: "pool", allow: []string{"messages", "rotation", "rotation/defaults", "topology", "topology/defaults", "internal/jsapi", "internal/lease", "bans"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// The web console reads and acts through the client library, as the
	// CLI does: nothing of the worker's, health's or the pools' insides.
	{pkg: "console", allow: []string{"client", "messages", "console/defaults", "rotation", "rotation/defaults", "internal/jsapi", "bans"}, forbid: [][]string{libvirtPkgs, sshPkgs}},
	// The guest's program stands alone.
	{pkg: "testguest"},
}

// listed is one package as go list -deps -json prints it.
type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Module     *struct{ Path, Dir string }
}

// goList runs go list -deps -json over the module's packages (tests not
// included: the rules are about what a package's code pulls in).
func goList(t *testing.T) map[string]*listed {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-json=ImportPath,Imports,Deps,Module", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*listed{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(listed)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// chain is a shortest import chain from one package to another, for the
// failure message.
func chain(pkgs map[string]*listed, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append(path, p)
			}
			slices.Reverse(path)
			return strings.Join(path, " → ")
		}
		if pkgs[p] == nil {
			continue
		}
		for _, q := range pkgs[p].Imports {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return from + " → … → " + to
}

// TestImportRules checks every rule against what go list reports.
func TestImportRules(t *testing.T) {
	pkgs := goList(t)
	for _, r := range rules {
		path := module + "/" + r.pkg
		p := pkgs[path]
		if p == nil {
			t.Errorf("%s: no such package (rename its rule)", path)
			continue
		}
		for _, dep := range p.Deps {
			if rel, ok := strings.CutPrefix(dep, module+"/"); ok {
				if !slices.Contains(r.allow, rel) && !strings.HasPrefix(rel, r.pkg+"/") {
					t.Errorf("%s may not import %s: %s", path, dep, chain(pkgs, path, dep))
				}
				continue
			}
			for _, family := range r.forbid {
				for _, prefix := range family {
					if strings.HasPrefix(dep, prefix) {
						t.Errorf("%s may not import %s: %s", path, dep, chain(pkgs, path, dep))
					}
				}
			}
		}
	}
}

// mapRow matches a row of the package map: | `pkg` | job | may import |.
var mapRow = regexp.MustCompile("^\\| `([a-z0-9/]+)` \\|[^|]*\\|([^|]*)\\|$")

// TestMapMatchesRules: the "may import" column of the map in
// docs/ARCHITECTURE.md (the backquoted names before any ";") names the
// same proxyfleet packages as the rules, so the map cannot drift from
// what is checked.
func TestMapMatchesRules(t *testing.T) {
	pkgs := goList(t)
	var dir string
	for _, p := range pkgs {
		if p.Module != nil && p.Module.Path == module {
			dir = p.Module.Dir
			break
		}
	}
	doc, err := os.ReadFile(filepath.Join(dir, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	inMap := map[string][]string{}
	name := regexp.MustCompile("`([a-z0-9/]+)`")
	for line := range strings.Lines(string(doc)) {
		m := mapRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		may, _, _ := strings.Cut(m[2], ";")
		allow := []string{}
		for _, n := range name.FindAllStringSubmatch(may, -1) {
			allow = append(allow, n[1])
		}
		inMap[m[1]] = allow
	}
	for _, r := range rules {
		got, ok := inMap[r.pkg]
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md: the package map has no row for %s", r.pkg)
			continue
		}
		want := append([]string{}, r.allow...)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("docs/ARCHITECTURE.md: %s may import %v by the map, %v by the rules", r.pkg, got, want)
		}
	}
	for p := range inMap {
		found := false
		for path := range pkgs {
			found = found || path == module+"/"+p || strings.HasPrefix(path, module+"/"+p+"/")
		}
		if !found {
			t.Errorf("docs/ARCHITECTURE.md: the package map names %s, which holds no package", p)
		}
	}
}
