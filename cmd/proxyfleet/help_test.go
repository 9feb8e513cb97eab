package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpOfEveryCommand: --help (and -h, and `help CMD`) of every
// command exits 0 and prints its usage line with its positional
// arguments, a one-line description, examples and its flags, the older
// flag names left out; --timeout says what it does for that verb.
func TestHelpOfEveryCommand(t *testing.T) {
	ctx := context.Background()
	for _, form := range [][]string{{"help", "--help"}, {"help", "help"}, {"--help", "-h"}, {"-h", "help", "x"}} {
		if o, e, code := runCLI(ctx, form...); code != 0 || e != "" || o != usage {
			t.Errorf("%v: exit %d, want the usage\nstdout: %s\nstderr: %s", form, code, o, e)
		}
	}
	for _, name := range append(commandNames(), "dead", "pool", "ban") {
		if name == "help" {
			continue
		}
		words := strings.Fields(name)
		for _, form := range [][]string{append(words, "--help"), append(words, "-h"), append([]string{"help"}, words...)} {
			o, e, code := runCLI(ctx, form...)
			h := helps[name]
			want := "Usage: proxyfleet " + name + " "
			if h.args != "" {
				want += h.args + " "
			}
			if code != 0 || e != "" || !strings.HasPrefix(o, want+"[flags]\n\n"+capitalise(h.summary)+".\n") || h.summary == "" ||
				!strings.Contains(o, "\nExamples:\n  ") || strings.Contains(o, "-nats-url") || strings.Contains(o, "-tls-ca") || strings.Contains(o, "-debug") {
				t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s", form, code, o, e)
			}
			for _, ex := range h.examples {
				if !strings.Contains(ex, "proxyfleet "+words[0]) {
					t.Errorf("%s: example %q does not run it", name, ex)
				}
			}
		}
	}
	for name, want := range map[string]string{"create": timeoutSend, "delete": timeoutSend, "dead replay": timeoutSend,
		"get": timeoutRead, "list": timeoutRead, "hosts": timeoutRead, "addresses": timeoutRead, "rotation": timeoutRead, "dead ls": timeoutRead, "watch": timeoutWatch,
		"pool set": timeoutSend, "pool rm": timeoutSend, "pool recycle": timeoutSend, "pool get": timeoutRead, "pool ls": timeoutRead} {
		o, _, _ := runCLI(ctx, append(strings.Fields(name), "--help")...)
		if !strings.Contains(o, "\n  --timeout duration\n    \t"+want+"\n") {
			t.Errorf("%s --help: want --timeout %q\n%s", name, want, o)
		}
		if hasWait := strings.Contains(o, "\n  --wait\n"); hasWait != (want == timeoutSend) {
			t.Errorf("%s --help: --wait listed %v", name, hasWait)
		}
	}
	for _, name := range []string{"serve", "setup", "worker", "health", "pools"} {
		o, _, _ := runCLI(ctx, name, "--help")
		for _, f := range []string{"--server", "--context", "--creds", "--nkey", "--user", "--password", "--tlscert", "--tlskey", "--tlsca", "--prefix", "--log-level", "--log-format"} {
			if !strings.Contains(o, "\n  "+f+" ") {
				t.Errorf("%s --help lacks %s", name, f)
			}
		}
	}
	// A bad flag is a usage error: exit 2, the usage line on stderr.
	if o, e, code := runCLI(ctx, "get", "p1", "--frob"); code != 2 || o != "" ||
		e != "flag provided but not defined: -frob\nusage: proxyfleet get ID [flags] (proxyfleet get --help for more)\n" {
		t.Errorf("a bad flag: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	if _, e, code := runCLI(ctx, "dead", "frob"); code != 2 || !strings.HasPrefix(e, "usage: proxyfleet dead ls | replay") {
		t.Errorf("dead frob: exit %d, %q", code, e)
	}
}

// TestVersion prints the version, commit and Go version.
func TestVersion(t *testing.T) {
	o, e, code := runCLI(context.Background(), "version")
	lines := strings.Split(o, "\n")
	if code != 0 || e != "" || len(lines) != 4 || !strings.HasPrefix(lines[0], "proxyfleet ") || !strings.HasPrefix(lines[1], "commit ") ||
		!strings.HasPrefix(lines[2], "go1.") {
		t.Fatalf("version: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	o, _, code = runCLI(context.Background(), "version", "--json")
	if code != 0 || !strings.Contains(o, `"version": `) || !strings.Contains(o, `"go": "go1.`) {
		t.Fatalf("version --json: exit %d\n%s", code, o)
	}
}

// TestBashCompletion sources the bash completion script into a real bash
// and completes commands, sub-verbs, flags and context names with it.
func TestBashCompletion(t *testing.T) {
	ctxDir := isolateNATSEnv(t)
	writeContext(t, ctxDir, "prod", map[string]string{"url": "nats://127.0.0.1:4222"})
	o, e, code := runCLI(context.Background(), "completion", "bash")
	if code != 0 || e != "" {
		t.Fatalf("completion bash: exit %d, %s", code, e)
	}
	script := filepath.Join(t.TempDir(), "proxyfleet.bash")
	if err := os.WriteFile(script, []byte(o), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", `source "$1" && COMP_WORDS=(`+strings.Join(quoted, " ")+`) && COMP_CWORD=$((${#COMP_WORDS[@]}-1)) && { _proxyfleet; echo "${COMPREPLY[*]}"; }`, "bash", script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash completion of %v: %v\n%s", words, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"proxyfleet", "cre"}, "create"},
		{[]string{"proxyfleet", "de"}, "delete dead"},
		{[]string{"proxyfleet", "dead", "re"}, "replay"},
		{[]string{"proxyfleet", "dead", "replay", "--f"}, "--force"},
		{[]string{"proxyfleet", "pool", "r"}, "rm recycle"},
		{[]string{"proxyfleet", "host", ""}, "quarantine release"},
		{[]string{"proxyfleet", "host", "quarantine", "h1", "--re"}, "--reason"},
		{[]string{"proxyfleet", "pool", "set", "eu", "--max"}, "--max-age"},
		{[]string{"proxyfleet", "create", "p1", "--wa"}, "--wait"},
		{[]string{"proxyfleet", "get", "--wa"}, ""},
		{[]string{"proxyfleet", "worker", "--log-"}, "--log-format --log-level"},
		{[]string{"proxyfleet", "list", "--context", "pr"}, "prod"},
		{[]string{"proxyfleet", "completion", ""}, "bash zsh"},
	} {
		if got := complete(c.words...); got != c.want {
			t.Errorf("completing %v: %q, want %q", c.words, got, c.want)
		}
	}
	o, _, code = runCLI(context.Background(), "completion", "zsh")
	if code != 0 || !strings.HasPrefix(o, "#compdef proxyfleet\n") || !strings.Contains(o, "    dead_replay) flags=\"--all ") ||
		!strings.Contains(o, "compadd -- serve setup worker health gateway pools console create delete get list watch rotation hosts addresses dead pool host ban version completion help\n") {
		t.Errorf("completion zsh: exit %d\n%s", code, o)
	}
	if _, e, code := runCLI(context.Background(), "completion", "fish"); code != 2 || !strings.HasPrefix(e, "usage: proxyfleet completion bash | zsh") {
		t.Errorf("completion fish: exit %d, %q", code, e)
	}
}
