#!/usr/bin/env bash
# Builds promtool (Prometheus' rule checker and rule unit tester) at a pinned
# version from source through the Go module proxy, cached by version outside
# the repository (apart from hack/tools.sh's cache, so that pinning it
# again rebuilds nothing else). Prints the binary's path as its last line.
#
#   hack/promtool.sh            build it if missing, print its path
set -euo pipefail

PROMETHEUS_VERSION=v0.316.0 # Prometheus v3.16.0's module version

root=$(cd "$(dirname "$0")/.." && pwd)
# The Go release of go.mod's toolchain line, as the Makefile builds with:
# make tools and the test that runs promtool (under go test) then agree on
# the cache below.
export GOTOOLCHAIN
GOTOOLCHAIN=$(sed -n 's/^toolchain[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$root/go.mod")
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
bin="$cache/tools/promtool-$PROMETHEUS_VERSION-$(go env GOVERSION)"
if [[ ! -x "$bin/promtool" ]]; then
	echo "[tools] building promtool $PROMETHEUS_VERSION (a few minutes on 2 cores; cached in $bin afterwards)" >&2
	mkdir -p "$bin"
	GOBIN="$bin" go install -trimpath -ldflags '-s -w' "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
fi
echo "$bin/promtool"
