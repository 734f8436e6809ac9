#!/usr/bin/env bash
# Builds what running Kubernetes' own e2e tests against the local cluster
# needs, from source through the Go module proxy, and caches it by its
# inputs outside the repository: the e2e test binary (e2e.test, from
# k8s.io/kubernetes/test/e2e) and CoreDNS (the cluster DNS the cases
# expect). Installs the Debian packages whose programs the cases run in
# the app's pods (wget, OpenBSD nc, curl; the app image carries them). Prints
# the directory holding e2e.test and coredns as its last line of output.
# Kept apart from hack/tools.sh so that a change here does not rebuild the
# cluster's tools, and the reverse.
#
#   hack/upstream-e2e.sh            build what is missing, print the directory
#   hack/upstream-e2e.sh --print    print the directory without building
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/hack/upstream-e2e"
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
kube=$(sed -n "s/^[[:space:]]*\(require[[:space:]]\+\)\?k8s.io\/kubernetes \(v[^[:space:]]*\).*/\2/p" "$mod/go.mod" | head -1)
key=$( { go env GOVERSION; cat "$0"; find "$mod" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-12)
dir="$cache/upstream-e2e/kube-$kube-$key"

if [[ "${1:-}" == "--print" ]]; then
	echo "$dir"
	exit 0
fi
log() { printf '[upstream-e2e] %s\n' "$*" >&2; }
mkdir -p "$dir"
# The heartbeat of a build, stopped however the script ends (Ctrl-C too).
beat=
trap '[[ -n "$beat" ]] && kill "$beat" 2>/dev/null; true' EXIT

# build NAME CMD... runs CMD (which writes $dir/NAME.tmp) unless NAME is cached.
build() {
	local name=$1; shift
	[[ -x "$dir/$name" ]] && return 0
	log "building $name (cold builds take minutes on 2 cores; cached in $dir afterwards)"
	local start=$SECONDS
	( while sleep 60; do log "  still building $name ($((SECONDS - start))s)"; done ) >/dev/null &
	beat=$!
	if ! "$@"; then
		log "building $name failed"
		return 1
	fi
	kill "$beat" 2>/dev/null || true
	beat=
	mv "$dir/$name.tmp" "$dir/$name"
	log "built $name in $((SECONDS - start))s"
}

minor=${kube#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
# The test main of k8s.io/kubernetes/test/e2e is upstream's own
# (e2e_test.go); tools.go keeps what it imports in go.mod.
build e2e.test bash -c "cd '$mod' && go test -c -vet=off -trimpath -ldflags '$ldflags' -o '$dir/e2e.test.tmp' k8s.io/kubernetes/test/e2e"
# CoreDNS, static: the local cluster packs it as an image.
build coredns bash -c "cd '$mod/coredns' && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o '$dir/coredns.tmp' github.com/coredns/coredns"

# At the paths the app image takes them from (nodeimage.AppTools).
packages=()
[[ -x /usr/bin/wget ]] || packages+=(wget)
[[ -x /bin/nc.openbsd ]] || packages+=(netcat-openbsd)
[[ -x /usr/bin/curl ]] || packages+=(curl)
if ((${#packages[@]})); then
	log "installing Debian packages: ${packages[*]}"
	if [[ $(id -u) -ne 0 ]]; then
		log "missing Debian packages and this is not root: run 'apt-get install ${packages[*]}' as root"
		exit 1
	fi
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"; } >&2
fi
echo "$dir"
