//go:build tools

// Package tools pins CoreDNS, the cluster DNS that Kubernetes' own e2e
// cases expect (they reach Services by name from pods): hack/upstream-e2e.sh
// builds `go build github.com/coredns/coredns` from this module.
package tools

import _ "github.com/coredns/coredns"
