# proxyfleet. Run `make help` for the targets.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
GO ?= go
BIN := bin/proxyfleet
RUN_DIR := .run
STATICCHECK_VERSION := v0.8.2
# The image `make image` builds (its version and commit go into the binary)
# and the engine that builds it: docker if its daemon answers, else podman,
# else docker (which then says what is wrong).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE ?= proxyfleet:$(VERSION)
CONTAINER_ENGINE ?= $(shell if docker info >/dev/null 2>&1; then command -v docker; else command -v podman || command -v docker; fi)
# Tests that need the test host run against it; everything else runs anywhere.
TEST_PKGS ?= ./...
TEST_TIMEOUT ?= 40m
# `make fuzz`: package:target pairs, each fuzzed for FUZZTIME with FUZZPARALLEL
# workers (these machines have 2 cores). New inputs are minimized only briefly:
# the default 60s of minimizing would eat the whole FUZZTIME. The committed
# corpus is testdata/fuzz/<target>/ beside each package; `go test` runs it.
FUZZ_TARGETS := messages:FuzzDecodeCommand messages:FuzzSubjects messages:FuzzDecodeHostRoom kvm:FuzzDomainXML kvm:FuzzParseMark kvm:FuzzSeed kvm:FuzzNetworkConfig
FUZZTIME ?= 20s
FUZZPARALLEL ?= 1
FUZZMINIMIZETIME ?= 100x

.PHONY: help build image image-local run run-sim test test-unit lint bench bench-sim clean fuzz guest-image
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# `proxyfleet version` reports these.
LDFLAGS := -X main.buildVersion=$(shell git describe --tags --always --dirty 2>/dev/null) -X main.buildCommit=$(shell git rev-parse HEAD 2>/dev/null)

build: ## build bin/proxyfleet
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/proxyfleet

image: ## build the container image proxyfleet:VERSION from the Dockerfile with docker or podman (fails saying so without either)
	@if [ -z "$(CONTAINER_ENGINE)" ]; then echo "make image: neither docker nor podman is installed; no image built" >&2; exit 1; fi; \
	echo "$(CONTAINER_ENGINE) build -t $(IMAGE) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -f Dockerfile ."; \
	"$(CONTAINER_ENGINE)" build -t "$(IMAGE)" --build-arg "VERSION=$(VERSION)" --build-arg "COMMIT=$(COMMIT)" -f Dockerfile .

image-local: ## the same image with no registry: the binary built here (as the Dockerfile builds it) on scratch, with this machine's CA certificates (deploy/image/)
	@if [ -z "$(CONTAINER_ENGINE)" ]; then echo "make image-local: neither docker nor podman is installed; no image built" >&2; exit 1; fi; \
	IMAGE="$(IMAGE)" ENGINE="$(CONTAINER_ENGINE)" VERSION="$(VERSION)" COMMIT="$(COMMIT)" bash deploy/image/build-local.sh

run: build testhost ## set up the test host, then `proxyfleet serve` against it (embedded NATS, the gateway on 127.0.0.1:8888, the console on 127.0.0.1:8080) in the foreground; GUEST=debian boots the real Debian guest
	@bash deploy/run.sh

run-sim: build ## `proxyfleet serve` with two simulated hosts (no VMs) in the foreground
	@bash deploy/run-sim.sh

test: testhost ## set up the test host, then run every test with -race (fails on any skip)
	@bash deploy/gotest.sh $(TEST_PKGS)

test-unit: ## run the tests without setting up the test host (kvm tests will fail)
	@bash deploy/gotest.sh $(TEST_PKGS)

lint: ## go vet, gofmt and staticcheck
	$(GO) vet ./...
	$(GO) vet -tags killpoints ./cmd/proxyfleet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@test -x bin/staticcheck || GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	bin/staticcheck ./...

bench: testhost ## measure every figure beside its peer (sim and test-host sections); writes BENCHMARKS.md and bench/results.json; BENCH_ONLY=gateway,fleet re-measures those sections and keeps the others
	bash -c 'source .testhost/env && $(GO) run ./internal/tools/bench -out BENCHMARKS.md -json bench/results.json $(if $(BENCH_ONLY),-only $(BENCH_ONLY) -merge)'

bench-sim: ## measure only the figures that need no test host; prints markdown, writes bench/results-sim.json
	$(GO) run ./internal/tools/bench -sim -json bench/results-sim.json

fuzz: ## fuzz each target for FUZZTIME (20s) from its committed corpus; a crash fails it
	@FUZZTIME=$(FUZZTIME) FUZZPARALLEL=$(FUZZPARALLEL) FUZZMINIMIZETIME=$(FUZZMINIMIZETIME) bash deploy/fuzz.sh $(FUZZ_TARGETS)

guest-image: ## build the Debian 12 proxy guest (squid, cloud-init, qemu-guest-agent) into .guest/ with mmdebstrap (cached; as root)
	bash deploy/guest/build.sh

clean: ## remove build output and the make-run state
	rm -rf bin $(RUN_DIR) .run-sim

include deploy/testhost/testhost.mk
