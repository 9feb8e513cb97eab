#!/usr/bin/env bash
# make run: proxyfleet serve with the embedded NATS server and two simulated
# hosts, in the foreground. State lives under .run-sim/ (make clean removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$PWD/.run-sim
mkdir -p "$dir/sim/sim1" "$dir/sim/sim2" "$dir/data"
cfg=$dir/config.yaml
if [ ! -f "$cfg" ]; then
  cat > "$cfg" <<YAML
# Written by make run-sim: two simulated hosts (their "VMs" are files under
# $dir/sim). Edit freely; make clean starts over.
nats: {url: ""}
hosts:
  - {name: sim1, driver: sim, sim: {dir: "$dir/sim/sim1", delay: 200ms, boot_delay: 2s}}
  - {name: sim2, driver: sim, sim: {dir: "$dir/sim/sim2", delay: 200ms, boot_delay: 2s}}
images:
  - {name: demo, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
default_image: demo
proxy: {port: 3128, cpus: 1, memory_mib: 256}
worker: {poll_interval: 500ms}
health: {http: "127.0.0.1:8080"}
YAML
fi
listen=${PROXYFLEET_LISTEN:-127.0.0.1:4222}
cat <<TXT

proxyfleet serve: embedded NATS on nats://$listen, health on http://127.0.0.1:8080
config: $cfg (two sim hosts)

In another terminal:
  bin/proxyfleet create p1 --wait          # create a proxy, wait for its result
  bin/proxyfleet get p1                    # its desired and observed state
  bin/proxyfleet list                      # every proxy
  bin/proxyfleet watch                     # a live table (Ctrl-C to leave)
  bin/proxyfleet rotation                  # the proxies clients may use now
  bin/proxyfleet hosts                     # each host's owner, room and state
  curl -s http://127.0.0.1:8080/rotation   # the same, from the health process
  bin/proxyfleet delete p1 --wait

With the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):
  nats sub 'proxy.result.>' &
  nats pub proxy.cmd.create.p2 '{"v":1,"id":"p2"}' -H Nats-Msg-Id:my-cmd-1

Ctrl-C stops it (SIGTERM drains in-flight work first).

TXT
exec bin/proxyfleet serve --config "$cfg" --data-dir "$dir/data" --listen "$listen"
