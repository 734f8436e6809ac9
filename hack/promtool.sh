#!/usr/bin/env bash
# Builds promtool (Prometheus' rule checker and rule unit tester) at a pinned
# version from source through the Go module proxy, cached by version
# (hack/gotool.sh). Prints the binary's path as its last line.
#
#   hack/promtool.sh            build it if missing, print its path
set -euo pipefail

PROMETHEUS_VERSION=v0.316.0 # Prometheus v3.16.0's module version

exec "$(dirname "$0")/gotool.sh" promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool
