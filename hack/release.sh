#!/usr/bin/env bash
# Writes dist/install.yaml: config/default rendered by kustomize with ebb's
# image pinned by the digest `make image` wrote to dist/image.digest.
#
#   hack/release.sh IMAGE KUBECTL     e.g. hack/release.sh ghcr.io/ebbdev/ebb /path/to/kubectl
set -euo pipefail
image=$1
kubectl=$2
root=$(cd "$(dirname "$0")/.." && pwd)
digest=$(cat "$root/dist/image.digest")
[[ "$digest" == sha256:* ]] || { echo "dist/image.digest holds no digest: run 'make image'" >&2; exit 1; }
overlay=$(mktemp -d "$root/dist/release-overlay.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
cat > "$overlay/kustomization.yaml" <<YAML
resources:
- ../../config/default
images:
- name: ebb:dev
  newName: $image
  digest: $digest
YAML
"$kubectl" kustomize "$overlay" > "$root/dist/install.yaml"
grep -q "image: $image@$digest" "$root/dist/install.yaml" || { echo "dist/install.yaml does not pin $image@$digest" >&2; exit 1; }
echo "dist/install.yaml: $image@$digest"
