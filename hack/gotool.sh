#!/usr/bin/env bash
# Builds one Go command at a pinned version from source through the Go
# module proxy, with the Go release of go.mod's toolchain line (as the
# Makefile builds with, so that make tools and the tests that run the
# command under go test agree on the cache), cached by name and version
# outside the repository (apart from hack/tools.sh's cache, so that pinning
# it again rebuilds nothing else). Prints the binary's path as its last
# line. hack/helm.sh, hack/promtool.sh and hack/prometheus.sh hold the pins.
#
#   hack/gotool.sh NAME VERSION PACKAGE [LDFLAGS]    PACKAGE's last element is NAME
set -euo pipefail

name=$1
version=$2
package=$3
ldflags=${4:--s -w}

root=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN
GOTOOLCHAIN=$(sed -n 's/^toolchain[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$root/go.mod")
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
bin="$cache/tools/$name-$version-$(go env GOVERSION)"
if [[ ! -x "$bin/$name" ]]; then
	echo "[tools] building $name $version (a few minutes on 2 cores; cached in $bin afterwards)" >&2
	mkdir -p "$bin"
	GOBIN="$bin" go install -trimpath -ldflags "$ldflags" "$package@$version" >&2
fi
echo "$bin/$name"
