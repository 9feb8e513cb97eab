// Package deploy_test checks the container image's recipe: the Dockerfile
// parses into a build stage and a final stage of the shape it promises
// (static binary, distroless or scratch, non-root, the binary as its
// entrypoint), its build command run here makes a static binary, and
// `make image` hands it to docker or podman, or fails saying that neither
// exists.
package deploy_test

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// stage is one FROM and what follows it.
type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile reads instructions and stages. It knows the syntax the
// file uses: comments and parser directives on their own lines, a
// trailing backslash continuing a line, and the instructions below; any
// other instruction is an error, so a typo is not silently read as nothing.
func parseDockerfile(t *testing.T, path string) (args []instruction, stages []stage) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	known := []string{"FROM", "RUN", "COPY", "ARG", "ENV", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "EXPOSE", "LABEL"}
	var cur *instruction
	var all []instruction
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur == nil && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur != nil && strings.HasPrefix(line, "#") {
			continue // a comment inside a continued instruction
		}
		more := strings.HasSuffix(line, `\`)
		line = strings.TrimSuffix(line, `\`)
		if cur == nil {
			kw, rest, _ := strings.Cut(line, " ")
			kw = strings.ToUpper(kw)
			if !slices.Contains(known, kw) {
				t.Fatalf("%s:%d: unknown instruction %q", path, n, kw)
			}
			cur = &instruction{line: n, cmd: kw, args: strings.TrimSpace(rest)}
		} else {
			cur.args += " " + strings.TrimSpace(line)
		}
		if !more {
			all = append(all, *cur)
			cur = nil
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s: ends inside a continued instruction (line %d)", path, cur.line)
	}
	for _, in := range all {
		switch {
		case in.cmd == "FROM":
			fields := strings.Fields(in.args)
			s := stage{from: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			} else if len(fields) != 1 {
				t.Fatalf("%s:%d: FROM %s: want IMAGE [AS NAME]", path, in.line, in.args)
			}
			stages = append(stages, s)
		case len(stages) == 0:
			if in.cmd != "ARG" {
				t.Fatalf("%s:%d: %s before the first FROM", path, in.line, in.cmd)
			}
			args = append(args, in)
		default:
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	return args, stages
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s stage) last(t *testing.T, cmd string) instruction {
	t.Helper()
	all := s.all(cmd)
	if len(all) == 0 {
		t.Fatalf("stage %q (FROM %s) has no %s", s.name, s.from, cmd)
	}
	return all[len(all)-1]
}

// argDefault is ARG NAME=VALUE's value.
func argDefault(ins []instruction, name string) (string, bool) {
	for _, in := range ins {
		if in.cmd != "ARG" {
			continue
		}
		if k, v, ok := strings.Cut(in.args, "="); ok && k == name {
			return v, true
		} else if in.args == name {
			return "", true
		}
	}
	return "", false
}

// goLine is go.mod's go directive, major.minor.
func goLine(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

// buildRun is the build stage's `go build` RUN, with its output path.
func buildRun(t *testing.T, b stage) (cmd, out string) {
	t.Helper()
	for _, in := range b.all("RUN") {
		if strings.Contains(in.args, "go build") {
			m := regexp.MustCompile(`-o (\S+)`).FindStringSubmatch(in.args)
			if m == nil {
				t.Fatalf("Dockerfile:%d: go build without -o", in.line)
			}
			return in.args, m[1]
		}
	}
	t.Fatalf("build stage %q has no RUN go build", b.name)
	return "", ""
}

func TestDockerfile(t *testing.T) {
	global, stages := parseDockerfile(t, "../Dockerfile")
	if len(stages) != 2 {
		t.Fatalf("%d stages, want 2 (build, then the image)", len(stages))
	}
	build, final := stages[0], stages[1]

	// The build stage: Go of go.mod, a static build of ./cmd/proxyfleet
	// with the version and commit, no build tags (so no kill points).
	gv, ok := argDefault(global, "GO_VERSION")
	// Fully qualified: podman resolves no short name by default.
	if !ok || build.from != "docker.io/library/golang:${GO_VERSION}-bookworm" {
		t.Errorf("build stage FROM %s (ARG GO_VERSION %q): want docker.io/library/golang:${GO_VERSION}-bookworm with a default", build.from, gv)
	}
	if want := goLine(t); gv != want {
		t.Errorf("ARG GO_VERSION=%s, go.mod says go %s", gv, want)
	}
	if build.name == "" {
		t.Fatal("build stage has no name for COPY --from")
	}
	run, out := buildRun(t, build)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.buildVersion=${VERSION}", "-X main.buildCommit=${COMMIT}", "./cmd/proxyfleet"} {
		if !strings.Contains(run, want) {
			t.Errorf("build RUN lacks %q: %s", want, run)
		}
	}
	if strings.Contains(run, "-tags") {
		t.Errorf("build RUN sets build tags (the killpoints tag must never reach an image): %s", run)
	}
	for _, a := range []string{"VERSION", "COMMIT"} {
		if _, ok := argDefault(build.ins, a); !ok {
			t.Errorf("build stage declares no ARG %s (the -X flag would be empty)", a)
		}
	}

	// The final stage: distroless static or scratch, the binary from the
	// build stage, a non-root numeric user, the binary as entrypoint.
	if final.from != "scratch" && !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s: want scratch or distroless static", final.from)
	}
	var binPath string
	for _, c := range final.all("COPY") {
		f := strings.Fields(c.args)
		if len(f) == 3 && f[0] == "--from="+build.name && f[1] == out {
			binPath = f[2]
		}
	}
	if binPath == "" {
		t.Fatalf("final stage copies no %s --from=%s", out, build.name)
	}
	user := final.last(t, "USER").args
	uid, gid, _ := strings.Cut(user, ":")
	for _, id := range []string{uid, gid} {
		if n, err := strconv.Atoi(id); err != nil || n == 0 {
			t.Errorf("USER %s: want numeric non-root uid:gid (a name needs /etc/passwd; runAsNonRoot needs a number)", user)
			break
		}
	}
	var entry []string
	if err := json.Unmarshal([]byte(final.last(t, "ENTRYPOINT").args), &entry); err != nil || len(entry) == 0 {
		t.Fatalf("ENTRYPOINT %s: want the exec form, a JSON array (there is no shell)", final.last(t, "ENTRYPOINT").args)
	}
	if entry[0] != binPath {
		t.Errorf("ENTRYPOINT runs %s, the binary is copied to %s", entry[0], binPath)
	}
	for _, in := range final.ins {
		if in.cmd == "RUN" {
			t.Errorf("Dockerfile:%d: RUN in the final stage (it has no shell)", in.line)
		}
	}
}

// TestDockerfileBuildIsStatic runs the build stage's RUN here, as the
// image build would, and reads the binary: statically linked, no
// interpreter, no shared libraries.
func TestDockerfileBuildIsStatic(t *testing.T) {
	t.Parallel()
	_, stages := parseDockerfile(t, "../Dockerfile")
	run, out := buildRun(t, stages[0])
	buildOnce(t) // the same flags: this build then links only (see image_run_test.go)
	bin := filepath.Join(t.TempDir(), "proxyfleet")
	run = strings.Replace(run, "-o "+out, "-o "+bin, 1)
	cmd := exec.Command("/bin/sh", "-c", run)
	cmd.Dir = ".." // the build context's WORKDIR
	cmd.Env = append(os.Environ(), "VERSION=v0.0.0-test", "COMMIT=0123abc")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", run, err, b)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v segment: not static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs %v", libs)
	}
}

// TestMakeImage runs `make image` with a recording docker, then with a
// recording podman only, then with neither (no engine is needed: `make
// test` never builds an image).
func TestMakeImage(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make not found")
	}
	runMake := func(path string, vars ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "-C", "..", "image"}, vars...)...)
		cmd.Env = append(os.Environ(), "PATH="+path)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	fake := func(name string) (dir, log string) {
		dir = t.TempDir()
		log = filepath.Join(dir, "argv")
		script := fmt.Sprintf("#!/bin/sh\npwd > %s\nprintf '%%s\\n' \"$@\" >> %s\n", log, log)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir, log
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{root, "build", "-t", "proxyfleet:v9.9.9", "--build-arg", "VERSION=v9.9.9", "--build-arg", "COMMIT=c0ffee", "-f", "Dockerfile", "."}
	for _, engine := range []string{"docker", "podman"} {
		dir, log := fake(engine)
		if out, err := runMake(dir, "VERSION=v9.9.9", "COMMIT=c0ffee"); err != nil {
			t.Fatalf("make image with %s: %v\n%s", engine, err, out)
		}
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatalf("make image did not run %s: %v", engine, err)
		}
		if got := strings.Fields(string(b)); !slices.Equal(got, want) {
			t.Errorf("make image ran %s in and with\n  %q\nwant\n  %q", engine, got, want)
		}
	}
	// Neither: asked for an image, make fails and says why.
	out, err := runMake(t.TempDir())
	if err == nil {
		t.Errorf("make image with neither docker nor podman exited 0, want a failure\n%s", out)
	}
	if !strings.Contains(out, "neither docker nor podman") {
		t.Errorf("make image with neither docker nor podman said %q", out)
	}
}

// TestImageLocalBuildsAsDockerfile: `make image-local` (deploy/image/)
// builds the binary with the Dockerfile's own command, each of its words
// (the output path aside) in build-local.sh, and its Dockerfile has the
// final stage's user and entrypoint.
func TestImageLocalBuildsAsDockerfile(t *testing.T) {
	_, stages := parseDockerfile(t, "../Dockerfile")
	run, out := buildRun(t, stages[0])
	b, err := os.ReadFile("image/build-local.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\\\n", " ")), " ")
	for _, w := range strings.Fields(strings.Replace(run, "-o "+out, "", 1)) {
		if !strings.Contains(script, w) {
			t.Errorf("image/build-local.sh lacks %q of the Dockerfile's build: %s", w, run)
		}
	}
	_, local := parseDockerfile(t, "image/Dockerfile.local")
	final := stages[len(stages)-1]
	if len(local) != 1 || local[0].from != "scratch" {
		t.Fatalf("image/Dockerfile.local: %d stages, want one FROM scratch", len(local))
	}
	for _, cmd := range []string{"USER", "ENTRYPOINT", "CMD", "EXPOSE"} {
		if got, want := local[0].last(t, cmd).args, final.last(t, cmd).args; got != want {
			t.Errorf("image/Dockerfile.local %s %s, the Dockerfile's is %s", cmd, got, want)
		}
	}
}
