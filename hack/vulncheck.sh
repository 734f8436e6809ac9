#!/usr/bin/env bash
# Holds ebb to the Go vulnerability database, with nothing fetched but
# modules: builds the database from golang.org/x/vulndb at the version
# hack/vulncheck/go.mod pins (its data/osv, through the Go module proxy,
# indexed by vulndb's own cmd/indexdb), then runs hack/vulncheck
# (govulncheck as a library) over ebb's source and, given a path, the
# image's binary. Builds are cached by their inputs outside the repository.
# Run with the Go release ebb is built with (the Makefile sets GOTOOLCHAIN):
# govulncheck judges the standard library of the release it runs under.
#
#   hack/vulncheck.sh [path/to/binary]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/hack/vulncheck"
cache=${EBB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb}
key=$( { go env GOVERSION; cat "$0" "$mod/go.mod" "$mod/go.sum" "$mod"/*.go; } | sha256sum | cut -c1-12)
dir="$cache/vulncheck/$key"
log() { printf '[vulncheck] %s\n' "$*" >&2; }

if [[ ! -x "$dir/bin/vulncheck" || ! -f "$dir/db/index/db.json" ]]; then
	log "building govulncheck and the database ($(go env GOVERSION); cached in $dir)"
	rm -rf "$dir" && mkdir -p "$dir/bin"
	(cd "$mod" && go build -o "$dir/bin/" tool && go build -o "$dir/bin/vulncheck" .)
	osv="$(cd "$mod" && go list -m -f '{{.Dir}}' golang.org/x/vulndb)/data/osv"
	"$dir/bin/indexdb" -vulns "$osv" -out "$dir/db.tmp"
	mv "$dir/db.tmp" "$dir/db"
fi
args=(-db "$dir/db" -C "$root" -accepted "$mod/accepted.txt")
[[ $# -gt 0 ]] && args+=(-binary "$1")
exec "$dir/bin/vulncheck" "${args[@]}"
