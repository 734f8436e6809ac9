// Package charts_test keeps the Helm chart charts/ebb and the kustomize
// base config/ from drifting apart: the chart's files/ are generated from
// config/ (go test ./charts -update-chart), and for every choice that both
// offer, `helm template` and kustomize render the same objects. It also
// checks, with helm built from source (hack/helm.sh), what only the chart
// offers, and that it lints.
package charts_test
