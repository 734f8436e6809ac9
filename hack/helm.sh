#!/usr/bin/env bash
# Builds helm at a pinned version from source through the Go module proxy
# (no release binary can be downloaded here), cached by version outside the
# repository (apart from hack/tools.sh's cache, so that pinning it again
# rebuilds nothing else). Prints the binary's path as its last line.
#
#   hack/helm.sh            build it if missing, print its path
set -euo pipefail

HELM_VERSION=v4.3.1

root=$(cd "$(dirname "$0")/.." && pwd)
# The Go release of go.mod's toolchain line, as the Makefile builds with:
# make tools and the tests that run helm (under go test) then agree on the
# cache below.
export GOTOOLCHAIN
GOTOOLCHAIN=$(sed -n 's/^toolchain[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$root/go.mod")
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
bin="$cache/tools/helm-$HELM_VERSION-$(go env GOVERSION)"
if [[ ! -x "$bin/helm" ]]; then
	echo "[tools] building helm $HELM_VERSION (a few minutes on 2 cores; cached in $bin afterwards)" >&2
	mkdir -p "$bin"
	# helm's version command and the chart API's capabilities read these.
	ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
	GOBIN="$bin" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
fi
echo "$bin/helm"
