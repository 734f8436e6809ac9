#!/usr/bin/env bash
# Builds the Prometheus server at the version hack/promtool.sh pins, from
# source through the Go module proxy (its web UI's assets are not built in:
# the HTTP API is what the tests use), cached by version (hack/gotool.sh).
# test/e2e/helm runs it to scrape ebb's pods as a ServiceMonitor has
# Prometheus do, and evaluates every dashboard query and alert rule on
# what it scraped. Prints the binary's path as its last line.
#
#   hack/prometheus.sh            build it if missing, print its path
set -euo pipefail

PROMETHEUS_VERSION=$(sed -n 's/^PROMETHEUS_VERSION=\([^[:space:]]*\).*/\1/p' "$(dirname "$0")/promtool.sh")
exec "$(dirname "$0")/gotool.sh" prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus
