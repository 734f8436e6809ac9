#!/usr/bin/env bash
# Builds ebb's pinned tools from source through the Go module proxy and caches
# them by version outside the repository, so a second run (and CI on the same
# machine) skips the build. Prints the directory holding the binaries as its
# last line of output.
#
#   hack/tools.sh            build what is missing, print the bin directory
#   hack/tools.sh --print    print the bin directory without building
set -euo pipefail

KUBE_VERSION=1.36.3
ETCD_VERSION=$(awk '/go.etcd.io\/etcd\/server\/v3 /{print $2; exit}' "$(dirname "$0")/tools/etcd/go.mod")
KWOK_VERSION=v0.8.0
CONTROLLER_GEN_VERSION=v0.21.0
STATICCHECK_VERSION=v0.8.2

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
# The key covers every input of the build, so editing a pin rebuilds.
key=$( { go env GOVERSION; cat "$0" "$root"/hack/tools/*/go.mod "$root"/hack/tools/*/go.sum; find "$root/hack/tools" -name '*.go' -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-12)
bin="$cache/tools/kube-v$KUBE_VERSION-$key/bin"

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$bin"

log() { printf '[tools] %s\n' "$*" >&2; }

# build NAME CMD... runs CMD (which writes $bin/NAME) unless NAME is cached.
build() {
	local name=$1; shift
	if [[ -x "$bin/$name" ]]; then
		return 0
	fi
	log "building $name (cold builds take minutes on 2 cores; cached in $bin afterwards)"
	local start=$SECONDS
	# Print a heartbeat so a long compile does not look hung.
	( while sleep 30; do log "  still building $name ($((SECONDS - start))s)"; done ) &
	local beat=$!
	if ! "$@"; then
		kill "$beat" 2>/dev/null || true
		log "building $name failed"
		return 1
	fi
	kill "$beat" 2>/dev/null || true
	wait "$beat" 2>/dev/null || true
	log "built $name in $((SECONDS - start))s"
}

minor=${KUBE_VERSION#*.}; minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

kube() { (cd "$root/hack/tools/kube" && go build -trimpath -ldflags "$kube_ldflags" -o "$bin/$1" "./$1"); }
for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet; do
	build "$c" kube "$c"
done
# agnhost, Kubernetes' own test server: the local cluster's app image. Built
# from its upstream main package (hack/tools/kube/tools.go keeps its modules).
agnhost() (
	cd "$root/hack/tools/kube" || return 1
	local version
	version=$(cat "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/VERSION") || return 1
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.Version=$version" -o "$bin/agnhost" k8s.io/kubernetes/test/images/agnhost
)
build agnhost agnhost
# pause: the pod sandbox of the app images (hack/tools/pause).
build pause bash -c "cd '$root/hack/tools/pause' && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o '$bin/pause' ."
# containerd v2, its runc shim and ctr: the real nodes' container runtime
# (Debian's containerd is 1.6, which kubelet 1.36 warns about and 1.37 drops).
containerd() {
	local v
	v=$(cd "$root/hack/tools/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2) || return 1
	(cd "$root/hack/tools/containerd" && CGO_ENABLED=0 go build -trimpath -tags 'no_btrfs no_zfs no_devmapper' -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$v" -o "$bin/$1" "./$1")
}
for c in containerd containerd-shim-runc-v2 ctr; do
	build "$c" containerd "$c"
done

# kubectl: the one on PATH when it is within one minor of the cluster, else ours.
if [[ ! -x "$bin/kubectl" ]]; then
	path_minor=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1 || true)
	if [[ -n "$path_minor" ]] && (( path_minor >= minor - 1 && path_minor <= minor + 1 )); then
		ln -sf "$(command -v kubectl)" "$bin/kubectl"
		log "using kubectl from PATH (1.$path_minor)"
	else
		build kubectl kube kubectl
	fi
fi

build etcd bash -c "cd '$root/hack/tools/etcd' && go build -trimpath -ldflags '-s -w' -o '$bin/etcd' ."
build kwok env GOBIN="$bin" go install -trimpath -ldflags '-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
if [[ ! -d "$bin/kwok-stages" ]]; then
	src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
	mkdir -p "$bin/kwok-stages.tmp"
	for s in node/fast node/heartbeat-with-lease pod/general; do
		for f in "$src/$s"/*.yaml; do
			[[ "$(basename "$f")" == kustomization.yaml ]] && continue
			cp "$f" "$bin/kwok-stages.tmp/${s//\//-}-$(basename "$f")"
		done
	done
	mv "$bin/kwok-stages.tmp" "$bin/kwok-stages"
fi
# Debian packages the local cluster runs: kube-proxy's nftables mode drives
# the kernel through the nft binary (sigs.k8s.io/knftables); the router
# learns load-balancer addresses by BGP with FRR (bgpd and zebra); the real
# nodes' containerd runs containers with runc and wires pods with the CNI
# reference plugins (ptp, host-local, loopback); the app image's shell
# and tools are busybox's (static).
apt_packages=()
command -v nft >/dev/null || apt_packages+=(nftables)
[[ -x /usr/lib/frr/bgpd && -x /usr/lib/frr/zebra ]] || apt_packages+=(frr)
command -v runc >/dev/null || apt_packages+=(runc)
[[ -x /usr/lib/cni/ptp && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || apt_packages+=(containernetworking-plugins)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || apt_packages+=(busybox-static)
if ((${#apt_packages[@]})); then
	log "installing Debian packages: ${apt_packages[*]}"
	if [[ $(id -u) -ne 0 ]]; then
		log "missing Debian packages and this is not root: run 'apt-get install ${apt_packages[*]}' as root"
		exit 1
	fi
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_packages[@]}"; } >&2
fi
build controller-gen env GOBIN="$bin" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION"
build staticcheck env GOBIN="$bin" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"

echo "$bin"
