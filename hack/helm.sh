#!/usr/bin/env bash
# Builds helm at a pinned version from source through the Go module proxy
# (no release binary can be downloaded here), cached by version
# (hack/gotool.sh). Prints the binary's path as its last line.
#
#   hack/helm.sh            build it if missing, print its path
set -euo pipefail

HELM_VERSION=v4.3.1

# helm's version command and the chart API's capabilities read these.
exec "$(dirname "$0")/gotool.sh" helm "$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
	"-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
