#!/usr/bin/env bash
# Builds the eBPF kernel path's object, internal/dataplane/bpf/ebb_lb.o, with
# a pinned compiler (Debian bookworm's clang-14 at CLANG_VERSION; installed
# with apt-get when missing), or checks that the committed object is what
# its source builds to. The object is committed so that building ebb needs
# no clang; the check (make test runs it) makes sure nobody committed an
# object that its source does not give. The kernel headers (Debian's
# linux-libc-dev) are not pinned: the UAPI the program uses does not change
# within a Debian release; a mismatch message names their version.
#
#   hack/bpf.sh build    rebuild ebb_lb.o in place
#   hack/bpf.sh check    fail if ebb_lb.o differs from a fresh build
set -euo pipefail

CLANG_VERSION=1:14.0.6-12
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/internal/dataplane/bpf"

installed() { dpkg-query -W -f '${Version}' "$1" 2>/dev/null || true; }
if [[ "$(installed clang-14)" != "$CLANG_VERSION" || "$(installed llvm-14)" != "$CLANG_VERSION" ]]; then
	echo "[bpf] installing clang-14 and llvm-14 $CLANG_VERSION" >&2
	pkgs=(clang-14="$CLANG_VERSION" llvm-14="$CLANG_VERSION")
	install() { apt-get install -y --allow-downgrades "${pkgs[@]}" >/dev/null; }
	install || { apt-get update >/dev/null && install; } || {
		echo "bpf: cannot install clang-14 $CLANG_VERSION (Debian bookworm's); if the archive no longer has it, move CLANG_VERSION in hack/bpf.sh to the version it has, run 'make bpf' and commit the object" >&2
		exit 1
	}
fi

# compile OUT: the flags that make the object independent of the checkout's
# path (-fdebug-prefix-map) and free of debug sections beyond BTF.
compile() {
	(cd "$src" && clang-14 -O2 -g -mcpu=v3 -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
		-fdebug-prefix-map="$src=." -c ebb_lb.c -o "$1" && llvm-strip-14 -g "$1")
}

case "${1:-}" in
build)
	compile "$src/ebb_lb.o"
	;;
check)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	compile "$tmp/ebb_lb.o"
	if ! cmp -s "$tmp/ebb_lb.o" "$src/ebb_lb.o"; then
		echo "bpf: internal/dataplane/bpf/ebb_lb.o is not what ebb_lb.c builds to with clang-14 $CLANG_VERSION (kernel headers: linux-libc-dev $(installed linux-libc-dev)); run 'make bpf' and commit the object" >&2
		exit 1
	fi
	echo "bpf: ebb_lb.o matches its source (clang-14 $CLANG_VERSION)"
	;;
*)
	echo "usage: hack/bpf.sh build|check" >&2
	exit 2
	;;
esac
