//go:build tools

// Package tools keeps in go.mod what the tools built from upstream main
// packages need: agnhost, Kubernetes' own test server (the app image of the
// local cluster's pods), is built with `go build
// k8s.io/kubernetes/test/images/agnhost`, as its Makefile does.
package tools

import _ "k8s.io/kubernetes/test/images/agnhost"
