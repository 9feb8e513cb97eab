// Command proxyfleet runs and drives a fleet of proxy VMs.
//
//	proxyfleet serve    [flags]   embedded NATS (or --server), set-up and its repairer, a worker and the health consumer
//	proxyfleet setup    [flags]   create or update every stream and bucket to the config (admin credential)
//	proxyfleet worker   [flags]   the worker role only
//	proxyfleet health   [flags]   the health role only
//	proxyfleet gateway  [flags]   one address for clients: a forward proxy (HTTP, SOCKS5) over the rotation
//	proxyfleet console  [flags]   the web console: the fleet in a browser, live, and an admin's actions
//	proxyfleet create ID [--host H] [--image I] [--cpus N] [--memory-mib M] [--command-id C] [--wait]
//	proxyfleet delete ID [--command-id C] [--wait]
//	proxyfleet get ID | list | watch | rotation | hosts | addresses [HOST]
//	proxyfleet dead ls | dead replay ID|--all | version | completion bash|zsh
//
// Each role is a roleSpec (role.go): its flags, how its config is read
// and checked, and how it is built on its NATS connection into a run, a
// ready and a close. runRole runs one role command through them, and
// serve builds every spec on a connection of its own in one process
// (serve.go). Either holds what it opens in one lifecycle: the parts run
// together by runAll (run.go), and when one fails the others stop and
// the process exits 1 with its error; the first SIGINT or SIGTERM stops
// them all (a worker drains), a second exits at once; once all have
// returned, what was opened (providers, connections, serve's embedded
// server) is closed, last opened first. roles.go maps the config onto
// the worker.
//
// Every command connects as the nats CLI does (natsconn.go: flags, NATS_*
// variables, nats contexts, the config file, in that order), takes --help
// (help.go) and logs as --log-level and --log-format say (logging.go).
package main
