#!/usr/bin/env bash
# Builds Kubernetes' own e2e test binary (e2e.test) from k8s.io/kubernetes
# through the Go module proxy, as hack/tools.sh builds the control plane,
# and caches it by its inputs outside the repository. Prints the binary's
# path as its last line of output. Kept apart from hack/tools.sh so that a
# change here does not rebuild the cluster's tools, and the reverse.
#
#   hack/upstream-e2e.sh            build it when missing, print its path
#   hack/upstream-e2e.sh --print    print its path without building
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/hack/upstream-e2e"
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
kube=$(sed -n "s/^[[:space:]]*\(require[[:space:]]\+\)\?k8s.io\/kubernetes \(v[^[:space:]]*\).*/\2/p" "$mod/go.mod" | head -1)
key=$( { go env GOVERSION; cat "$0" "$mod/go.mod" "$mod/go.sum" "$mod/tools.go"; } | sha256sum | cut -c1-12)
bin="$cache/upstream-e2e/kube-$kube-$key/e2e.test"

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi
if [[ ! -x "$bin" ]]; then
	log() { printf '[upstream-e2e] %s\n' "$*" >&2; }
	log "building Kubernetes' e2e.test $kube (a cold build takes about 15 minutes on 2 cores; cached in $(dirname "$bin") afterwards)"
	start=$SECONDS
	( while sleep 60; do log "  still building e2e.test ($((SECONDS - start))s)"; done ) >/dev/null &
	beat=$!
	trap 'kill $beat 2>/dev/null || true' EXIT
	mkdir -p "$(dirname "$bin")"
	minor=${kube#v1.}; minor=${minor%%.*}
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	# The test main of k8s.io/kubernetes/test/e2e is upstream's own
	# (e2e_test.go); tools.go keeps what it imports in go.mod.
	(cd "$mod" && go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$bin.tmp" k8s.io/kubernetes/test/e2e)
	mv "$bin.tmp" "$bin"
	log "built e2e.test in $((SECONDS - start))s"
fi
echo "$bin"
