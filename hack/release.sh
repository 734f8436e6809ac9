#!/usr/bin/env bash
# Writes dist/install.yaml: config/default rendered by kustomize with ebb's
# image pinned by the digest `make image` wrote to dist/image.digest; and
# dist/install-kernel-ebpf.yaml, the same with the component
# config/components/kernel-ebpf (ebb lb's kernel engine on its eBPF path);
# dist/install-eviction-guard.yaml, with config/components/eviction-guard;
# dist/install-webhook-client-auth.yaml, with
# config/components/webhook-client-auth; dist/install-monitoring.yaml, with
# config/components/monitoring (the alert rules as a PrometheusRule, for
# clusters with the Prometheus operator); dist/install-servicemonitor.yaml,
# with config/components/servicemonitor (a ServiceMonitor of the
# components' metrics over HTTPS); dist/install-dashboards.yaml, with
# config/components/dashboards (the Grafana dashboards as ConfigMaps for
# Grafana's sidecar) and the dashboards' JSON in dist/dashboards/; and
# dist/ebb-alert-rules.yaml,
# the same rules as a plain Prometheus rules file (docs/alerts.md); and
# dist/ebb-VERSION.tgz, the Helm chart charts/ebb with the same image
# (docs/helm.md), which helm push uploads to an OCI registry.
#
#   hack/release.sh IMAGE KUBECTL HELM VERSION
#   e.g. hack/release.sh ghcr.io/ebbdev/ebb /path/to/kubectl /path/to/helm v0.1.0-dev.0123abcd
set -euo pipefail
image=$1
kubectl=$2
helm=$3
version=$4
root=$(cd "$(dirname "$0")/.." && pwd)
digest=$(cat "$root/dist/image.digest")
[[ "$digest" == sha256:* ]] || { echo "dist/image.digest holds no digest: run 'make image'" >&2; exit 1; }
overlay=$(mktemp -d "$root/dist/release-overlay.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
# render OUT [COMPONENT]: config/default, the image pinned, with COMPONENT.
render() {
  local out=$1 component=${2:-}
  {
    echo "resources:"
    echo "- ../../config/default"
    [[ -z "$component" ]] || printf 'components:\n- ../../config/components/%s\n' "$component"
    echo "images:"
    echo "- name: ebb:dev"
    echo "  newName: $image"
    echo "  digest: $digest"
  } > "$overlay/kustomization.yaml"
  "$kubectl" kustomize "$overlay" > "$root/dist/$out"
  grep -q "image: $image@$digest" "$root/dist/$out" || { echo "dist/$out does not pin $image@$digest" >&2; exit 1; }
  echo "dist/$out: $image@$digest"
}
render install.yaml
render install-kernel-ebpf.yaml kernel-ebpf
render install-eviction-guard.yaml eviction-guard
render install-webhook-client-auth.yaml webhook-client-auth
render install-monitoring.yaml monitoring
render install-servicemonitor.yaml servicemonitor
render install-dashboards.yaml dashboards
mkdir -p "$root/dist/dashboards"
cp "$root"/config/monitoring/dashboards/*.json "$root/dist/dashboards/"
echo "dist/dashboards/"
cp "$root/config/monitoring/rules.yaml" "$root/dist/ebb-alert-rules.yaml"
echo "dist/ebb-alert-rules.yaml"

# The chart: its values pin the image by digest, its version is ebb's
# (SemVer without the v; a prerelease identifier of digits only may not
# start with 0, so a commit hash of digits only gets a g before it).
chart_version=${version#v}
if [[ "$chart_version" =~ ^([^-]*-.*\.)(0[0-9]+)$ ]]; then
  chart_version="${BASH_REMATCH[1]}g${BASH_REMATCH[2]}"
fi
chart="$overlay/chart/ebb"
mkdir -p "$overlay/chart"
cp -r "$root/charts/ebb" "$chart"
sed -i -e "s|^  repository: ebb\$|  repository: $image|" -e "s|^  tag: dev\$|  tag: \"$version\"|" -e "s|^  digest: \"\"\$|  digest: \"$digest\"|" "$chart/values.yaml"
rm -f "$root"/dist/ebb-*.tgz
HELM_CONFIG_HOME="$overlay/helm" HELM_CACHE_HOME="$overlay/helm" HELM_DATA_HOME="$overlay/helm" \
  "$helm" package "$chart" --version "$chart_version" --app-version "$version" -d "$root/dist" >/dev/null
packaged="$root/dist/ebb-$chart_version.tgz"
HELM_CONFIG_HOME="$overlay/helm" HELM_CACHE_HOME="$overlay/helm" HELM_DATA_HOME="$overlay/helm" \
  "$helm" template ebb "$packaged" --namespace ebb-system | grep -q "image: $image@$digest" || { echo "$packaged does not pin $image@$digest" >&2; exit 1; }
echo "dist/ebb-$chart_version.tgz: $image@$digest"
