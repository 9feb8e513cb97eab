# proxyfleet's container image: one static binary on distroless, as a
# non-root user. Build it with `make image` (docker or podman), which passes
# the version and commit:
#   docker build --build-arg VERSION=$(git describe --always) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t proxyfleet:dev .
# The binary needs no libc, no shell and no other program: it speaks NATS,
# SSH (to libvirtd) and HTTP itself. deploy/image_test.go checks this file.

# The Go of go.mod's `go` line.
ARG GO_VERSION=1.26

# Fully qualified: podman resolves no short name without a search registry
# of its own config (docker reads "golang" as docker.io/library/golang).
FROM docker.io/library/golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so a change of the sources reuses their layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# Static (no cgo), reproducible paths, no test-only code (no build tags:
# the kill points of the crash tests are not in it).
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" \
      -o /out/proxyfleet ./cmd/proxyfleet

# distroless static: CA certificates, tzdata, /etc/passwd with nonroot
# (65532); nothing else. Where no registry can be reached, `make
# image-local` builds the same image from scratch (deploy/image/).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/proxyfleet /usr/local/bin/proxyfleet
USER 65532:65532
# worker --http, health --http, health's probe_listen (see deploy/k8s).
EXPOSE 9090 9091 8081
ENTRYPOINT ["/usr/local/bin/proxyfleet"]
CMD ["help"]
