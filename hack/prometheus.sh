#!/usr/bin/env bash
# Builds the Prometheus server at the version hack/promtool.sh pins, from
# source through the Go module proxy (its web UI's assets are not built in:
# the HTTP API is what the tests use), cached by version outside the
# repository. test/e2e/helm runs it to scrape ebb's pods as a ServiceMonitor
# has Prometheus do, and evaluates every dashboard query and alert rule on
# what it scraped. Prints the binary's path as its last line.
#
#   hack/prometheus.sh            build it if missing, print its path
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
PROMETHEUS_VERSION=$(sed -n 's/^PROMETHEUS_VERSION=\([^[:space:]]*\).*/\1/p' "$root/hack/promtool.sh")
export GOTOOLCHAIN
GOTOOLCHAIN=$(sed -n 's/^toolchain[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$root/go.mod")
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
bin="$cache/tools/prometheus-$PROMETHEUS_VERSION-$(go env GOVERSION)"
if [[ ! -x "$bin/prometheus" ]]; then
	echo "[tools] building prometheus $PROMETHEUS_VERSION (a few minutes on 2 cores; cached in $bin afterwards)" >&2
	mkdir -p "$bin"
	GOBIN="$bin" go install -trimpath -ldflags '-s -w' "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >&2
fi
echo "$bin/prometheus"
