package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// helpText is what `proxyfleet CMD --help` says about a command besides
// its flags.
type helpText struct {
	args     string // the positional arguments, as in the usage line: "ID"
	summary  string // one line
	more     string // further paragraphs, optional
	examples []string
}

// helps are every command's, by name ("dead ls" for a sub-verb).
var helps = map[string]helpText{
	"serve": {
		args:    "--config F",
		summary: "run everything in one process: an embedded nats-server (unless a server is named), set-up and its repairer, a worker, the health process, the pool controller, the gateway when gateway.listen is set and the web console when console.listen is set",
		more: "--config is required: it names the hosts. Without --server, NATS_URL or a nats context\n" +
			"naming a URL, serve runs an embedded nats-server on --listen with its store in --data-dir.",
		examples: []string{"proxyfleet serve --config proxyfleet.yaml", "proxyfleet serve --config proxyfleet.yaml --server nats://nats:4222 --repair"},
	},
	"setup": {
		summary:  "create or update every stream and bucket to the config (an admin credential); with --repair keep recreating what is deleted",
		examples: []string{"proxyfleet setup --context admin", "proxyfleet setup --config prod.yaml --repair --interval 5s"},
	},
	"worker": {
		args:     "--config F",
		summary:  "run the worker role: intake of commands and execution on the configured hosts (--config is required)",
		more:     "--http serves /metrics, /healthz (liveness) and /readyz (ready: consuming and owning or ready to own hosts); with --pprof also Go's profiles under /debug/pprof/.",
		examples: []string{"proxyfleet worker --config proxyfleet.yaml --id wk-1 --http 127.0.0.1:9090", "NATS_CONTEXT=worker proxyfleet worker --config proxyfleet.yaml"},
	},
	"health": {
		summary:  "run the health role: fold state events and probes into the rotation, and serve it over HTTP",
		examples: []string{"proxyfleet health --config proxyfleet.yaml --http 127.0.0.1:8080"},
	},
	"gateway": {
		args:    "--config F",
		summary: "run the gateway: one address for the fleet's clients, an HTTP forward proxy (and SOCKS5) over the proxies in the rotation",
		more: "gateway.listen (or gateway.socks_listen) and gateway.users are required. A user name may carry options:\n" +
			"USER-session-KEY keeps a client on one proxy, USER-label-K-V selects by label, USER-pool-NAME by pool.\n" +
			"--http serves /metrics, /healthz (liveness) and /readyz (ready: the rotation read and the listeners bound).\n" +
			"A client: curl -x http://alice:PASSWORD@127.0.0.1:8888 https://example.com/",
		examples: []string{"proxyfleet gateway --config proxyfleet.yaml --http 127.0.0.1:9091"},
	},
	"console": {
		args:    "--config F",
		summary: "run the web console: the fleet in a browser (hosts, proxies, pools, the rotation's hour, the gateways' traffic, live), and an admin's actions as ordinary commands",
		more: "console.listen and console.users are required; each user logs in with the password in its password_file,\n" +
			"and only users with admin: true may act. console.gateways lists the gateways' ops listeners whose /metrics the\n" +
			"traffic page reads. --http serves /metrics, /healthz and /readyz. See docs/CONSOLE.md.",
		examples: []string{"proxyfleet console --config proxyfleet.yaml --http 127.0.0.1:9092"},
	},
	"create": {
		args: "ID", summary: "ask for a proxy named ID (lowercase letters, digits and '-')",
		more:     "Prints the command's id and sequence; with --wait also its results, and exits 1 if it was rejected or failed.",
		examples: []string{"proxyfleet create p1", "proxyfleet create p1 --host h1 --label team=a --wait", "proxyfleet create p1 --json"},
	},
	"delete": {
		args: "ID", summary: "ask for the proxy ID to be removed",
		more:     "With --wait, prints its results and exits 1 if it was rejected or failed.",
		examples: []string{"proxyfleet delete p1", "proxyfleet delete p1 --wait"},
	},
	"get": {
		args: "ID", summary: "show one proxy: its desired and reported state and its last result (exit 1 if unknown)",
		examples: []string{"proxyfleet get p1", "proxyfleet get p1 --json"},
	},
	"list": {
		summary: "list the fleet's proxies, all or those on a host, in a state or with labels, a page at a time if asked",
		examples: []string{"proxyfleet list", "proxyfleet list --all --json", "proxyfleet list --host h1 --state failed",
			"proxyfleet list --label pool=eu --limit 100", "proxyfleet list --limit 100 --after p0099"},
	},
	"watch": {
		summary:  "show state events live, until stopped or --timeout",
		examples: []string{"proxyfleet watch", "proxyfleet watch --json --timeout 1m"},
	},
	"rotation": {
		summary:  "show the rotation: the proxies clients may use",
		examples: []string{"proxyfleet rotation", "proxyfleet rotation --http http://127.0.0.1:8080"},
	},
	"hosts": {
		summary:  "show each host's owner, room and state",
		examples: []string{"proxyfleet hosts", "proxyfleet hosts --json"},
	},
	"host": {
		args: "quarantine | release", summary: "quarantine a host by hand (placement skips it, its work waits) or release it",
		examples: []string{"proxyfleet host quarantine h1 --reason \"disk swap\" --wait", "proxyfleet host release h1 --wait"},
	},
	"host quarantine": {
		args: "HOST", summary: "quarantine HOST until it is released: placement skips it and its work waits",
		more: "A command on NATS (proxy.cmd.host.quarantine.HOST), answered on proxy.result.host.HOST: a worker records it in\n" +
			"the host's record, with the reason as \"operator: REASON\". Unlike an automatic quarantine it has no cool-down:\n" +
			"no probe ends it, only `proxyfleet host release`. Proxies on the host keep running; `hosts` shows it.",
		examples: []string{"proxyfleet host quarantine h1 --reason \"disk swap\" --wait", "proxyfleet host quarantine h1 --json"},
	},
	"host release": {
		args: "HOST", summary: "end HOST's quarantine now, an operator's or an automatic one (its cool-down cut short)",
		more:     "The host's waiting work runs again and placement uses it. Releasing a host not quarantined changes nothing.",
		examples: []string{"proxyfleet host release h1 --wait"},
	},
	"addresses": {
		args: "[HOST]", summary: "show each host's address plan: its addresses held, cooling (freed within reuse_after) and free, and which proxy holds which",
		examples: []string{"proxyfleet addresses", "proxyfleet addresses h1 --json"},
	},
	"dead": {
		args: "ls | replay (ID | --all)", summary: "list or replay the commands that ran out of attempts (PROXY_DEAD; an admin credential)",
		examples: []string{"proxyfleet dead ls", "proxyfleet dead replay p1"},
	},
	"dead ls": {
		summary:  "list the dead letters: commands that ran out of attempts, with their last error",
		examples: []string{"proxyfleet dead ls", "proxyfleet dead ls --json"},
	},
	"dead replay": {
		args: "ID | --all", summary: "publish the dead-lettered command of proxy ID (or of every proxy) again, as a new command, and remove its dead letter",
		more: "A dead letter whose proxy has had a later command is skipped (replaying it would undo that command)\n" +
			"unless --force is given.",
		examples: []string{"proxyfleet dead replay p1", "proxyfleet dead replay --all --wait"},
	},
	"pools": {
		args:    "--config F",
		summary: "run the pool controller: keep each pool at its size in the rotation, recycle its members by age, replace the broken",
		more: "Every pool controller applies pool commands; the one holding the pools' lease runs the passes, the others stand by.\n" +
			"--http serves /metrics, /healthz (liveness) and /readyz (ready: consuming pool commands, the rotation and the pools read).",
		examples: []string{"proxyfleet pools --config proxyfleet.yaml --http 127.0.0.1:9093"},
	},
	"pool": {
		args: "set | get | ls | rm | recycle", summary: "keep pools of proxies: N ready proxies of one spec, recycled by age, the broken replaced",
		examples: []string{"proxyfleet pool set eu --size 20 --max-age 6h --wait", "proxyfleet pool ls"},
	},
	"pool set": {
		args: "NAME", summary: "create pool NAME, or replace its whole spec (a flag left out takes its default)",
		more: "Members are proxies NAME-xxxxxx labelled pool=NAME, made by ordinary create commands on the hosts with the\n" +
			"fewest members of the pool, then the most room. With --wait, exits once the pool is at its size in the\n" +
			"rotation (done), or 1 when it is degraded (its creates keep failing) or the set is rejected. With\n" +
			"--recycle-after-bans N, a member whose egress addresses are banned on N sites at once is replaced,\n" +
			"make-before-break, by one with fresh addresses.",
		examples: []string{"proxyfleet pool set eu --size 20 --min-ready 18 --surge 2 --max-age 6h --label country=de --wait",
			"proxyfleet pool set eu --size 20 --recycle-after-bans 3",
			"proxyfleet pool set eu --size 0"},
	},
	"pool get": {
		args: "NAME", summary: "show pool NAME: its settings, state and members",
		examples: []string{"proxyfleet pool get eu", "proxyfleet pool get eu --json"},
	},
	"pool ls": {
		summary:  "list the pools: size, members ready, creating, recycling (banned: for their bans) and retiring, the oldest's age, state",
		examples: []string{"proxyfleet pool ls", "proxyfleet pool ls --json"},
	},
	"pool rm": {
		args: "NAME", summary: "delete pool NAME: every member is deleted, then the pool",
		examples: []string{"proxyfleet pool rm eu --wait"},
	},
	"pool recycle": {
		args: "NAME (ID... | --all)", summary: "replace the members named (or all) now, make-before-break, as if they were old",
		more:     "Fresh addresses on demand. With --wait, exits once every member named was replaced and deleted.",
		examples: []string{"proxyfleet pool recycle eu --all --wait", "proxyfleet pool recycle eu eu-a1b2c3 eu-d4e5f6"},
	},
	"ban": {
		args: "add | ls | rm", summary: "ban an egress address for a site (its registrable domain), list the bans, lift one",
		examples: []string{"proxyfleet ban add 203.0.113.7 shop.example --for 30m --reason captcha", "proxyfleet ban ls --site shop.example"},
	},
	"ban add": {
		args: "ADDRESS SITE", summary: "ban the egress address ADDRESS for the site of SITE (any host of it) for --for",
		more: "Health stores the ban in PROXY_BANS, where it ends by itself; every gateway and follower of the rotation\n" +
			"passes the address over for that site within a second. A new ban of the same address and site replaces\n" +
			"the old one, shorter or longer. An address is never banned everywhere: bans are per site.",
		examples: []string{"proxyfleet ban add 203.0.113.7 www.shop.example --for 30m --reason captcha", "proxyfleet ban add 2001:db8::7 shop.example --for 2h --json"},
	},
	"ban ls": {
		summary:  "list the active bans: site, address, time left, source, who asked and why",
		examples: []string{"proxyfleet ban ls", "proxyfleet ban ls --site shop.example", "proxyfleet ban ls --address 203.0.113.7 --json"},
	},
	"ban rm": {
		args: "ADDRESS SITE", summary: "lift the ban of ADDRESS for the site of SITE (no error if there is none)",
		examples: []string{"proxyfleet ban rm 203.0.113.7 shop.example"},
	},
	"version": {
		summary:  "print proxyfleet's version, commit and Go version",
		examples: []string{"proxyfleet version", "proxyfleet version --json"},
	},
	"completion": {
		args: "bash | zsh", summary: "print a shell completion script",
		examples: []string{"source <(proxyfleet completion bash)", "proxyfleet completion zsh > \"${fpath[1]}/_proxyfleet\""},
	},
}

// newFlags is the flag set of command name, which reports a bad flag on
// stderr (parseFlags adds the usage line, and prints the full help for -h).
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// usageError prints the command's usage line on the flag set's output and
// returns the exit code of a usage error.
func usageError(fs *flag.FlagSet) error {
	fmt.Fprintf(fs.Output(), "usage: %s (proxyfleet %s --help for more)\n", usageLine(fs.Name()), fs.Name())
	return exitError{2}
}

// errHelp is what parseFlags returns once it has printed the help: the
// command ends, successfully.
var errHelp = errors.New("help printed")

// parseFlags parses args: -h or --help prints the help on stdout and
// returns errHelp; a bad flag has been reported and returns exitError{2}.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		printHelp(stdout, fs)
		return errHelp
	default:
		return usageError(fs)
	}
}

// usageLine is "proxyfleet NAME ARGS [flags]".
func usageLine(name string) string {
	line := "proxyfleet " + name
	if a := helps[name].args; a != "" {
		line += " " + a
	}
	return line + " [flags]"
}

// printHelp writes the command's usage, summary, examples and flags, the
// older flag names left out.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	h := helps[fs.Name()]
	fmt.Fprintf(w, "Usage: %s\n\n%s.\n", usageLine(fs.Name()), capitalise(h.summary))
	if h.more != "" {
		fmt.Fprintf(w, "\n%s\n", h.more)
	}
	if len(h.examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, e := range h.examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if hiddenFlags[f.Name] {
			return
		}
		if n == 0 {
			fmt.Fprintf(w, "\nFlags:\n")
		}
		n++
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		typ, usage := flag.UnquoteUsage(f)
		line := "  " + dash + f.Name
		if typ != "" {
			line += " " + typ
		}
		if !slices.Contains([]string{"", "false", "0", "0s", "map[]"}, f.DefValue) {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
}

func capitalise(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
