#!/bin/bash
# `make image-local`: builds the container image IMAGE from Dockerfile.local
# with ENGINE (docker or podman), with nothing from a registry (see
# Dockerfile.local). Called by the Makefile with IMAGE, ENGINE, VERSION and
# COMMIT in the environment.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${IMAGE:?}" "${ENGINE:?}" "${VERSION:=dev}" "${COMMIT:=unknown}"
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] || { echo "make image-local: no CA bundle at $ca (install ca-certificates, or set CA_BUNDLE)" >&2; exit 1; }

ctx=$(mktemp -d "${TMPDIR:-/tmp}/proxyfleet-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
# The Dockerfile's build command (deploy/image_test.go checks they agree).
(cd "$repo" && CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
	-ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" \
	-o "$root/usr/local/bin/proxyfleet" ./cmd/proxyfleet)
cp "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
chmod 644 "$root/etc/passwd" "$root/etc/group" "$root/etc/ssl/certs/ca-certificates.crt"
echo "$ENGINE build -t $IMAGE -f deploy/image/Dockerfile.local <context: static binary, CA bundle, passwd>"
"$ENGINE" build -t "$IMAGE" -f "$here/Dockerfile.local" "$ctx"
