#!/usr/bin/env bash
# Runs the tests with -race as JSON, one package at a time (the kvm and
# end-to-end tests share one test host: its libvirtd, its DHCP leases and
# two cores), and prints failures and skips and a closing
# "N passed, N failed, N skipped" line, and fails on any failure or skip.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ -f .testhost/env ] && source .testhost/env
mkdir -p bin
out=bin/test.json
go test -p 1 -race -count=1 -timeout "${TEST_TIMEOUT:-40m}" -json "${@:-./...}" > "$out" 2> bin/test.stderr
rc=$?
cat bin/test.stderr
go run ./internal/tools/testsum < "$out"
sum=$?
if [ $rc -ne 0 ] || [ $sum -ne 0 ]; then
  echo "make test: FAILED (go test exit $rc, summary exit $sum; full log: $out)"
  exit 1
fi
echo "make test: ok"
