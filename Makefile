# ebb's build. `make test` is what CI runs (.ci/run) and what the README says.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

# ebb's own binaries, tests and checks use the Go release go.mod's toolchain
# line names (hack/vulncheck fails when a scan ran under another). The
# machine's Go fetches it through the module proxy on first use. The cached
# test tools (hack/tools.sh, hack/upstream-e2e.sh) are Kubernetes' binaries
# for the local cluster, not shipped, and keep the machine's Go.
GO_TOOLCHAIN := $(shell sed -n 's/^toolchain[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' go.mod)
$(if $(GO_TOOLCHAIN),,$(error go.mod has no toolchain line: pin the Go release ebb is built with))
GO ?= env GOTOOLCHAIN=$(GO_TOOLCHAIN) go
# The pinned tools (control plane, etcd, kwok, kubectl, controller-gen,
# staticcheck) are built from source once and cached by version outside the
# repository; hack/tools.sh prints where.
TOOLS_BIN = $(shell hack/tools.sh --print)
# Kubernetes' own e2e test binary, built from source and cached apart from
# the tools (hack/upstream-e2e.sh).
UPSTREAM_E2E = $(shell hack/upstream-e2e.sh --print)
E2E_TIMEOUT ?= 30m
# Extra flags for `ebb demo`, e.g. make demo DEMO_FLAGS=--baseline=false (ebb
# only), or DEMO_FLAGS=--real-kubelets=false (kwok-simulated nodes, no root)
DEMO_FLAGS ?=
# The image `make image` builds and `make release` pins by digest.
IMAGE ?= ghcr.io/ebbdev/ebb
VERSION ?= v0.1.0-dev.$(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

.PHONY: all build image release tools test unit supply-chain e2e lint verify generate bpf demo fuzz bench-dataplane bench-dataplane-routed bench-service bench-cutover bench-drain bench-maintenance bench-lb-lifecycle bench-failover bench-abuse bench-faults upstream-e2e conformance clean

all: build

build:
	$(GO) build -o bin/ebb ./cmd/ebb
	$(GO) build -o bin/kubectl-maintenance ./cmd/kubectl-maintenance

## image: ebb's OCI image (static binary with its TLS roots, nonroot user) as an OCI layout in dist/oci, no container engine needed; reproducible; its SBOM (CycloneDX, from the binary's build information) in dist/sbom.cdx.json
image:
	mkdir -p dist
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -tags ebb_image -ldflags "-s -w -X github.com/ebbdev/ebb/internal/version.Version=$(VERSION)" -o dist/ebb-linux-amd64 ./cmd/ebb
	cd hack/image && $(GO) run . -binary ../../dist/ebb-linux-amd64 -out ../../dist/oci -ref $(IMAGE):$(VERSION) > ../../dist/image.digest
	cd hack/image && $(GO) tool cyclonedx-gomod bin -json -std -noserial -notimestamp -version $(VERSION) -output ../../dist/sbom.cdx.json ../../dist/ebb-linux-amd64
	@echo "$(IMAGE):$(VERSION)@$$(cat dist/image.digest) in dist/oci"

## release: dist/install.yaml, config/default with the image pinned by digest (kubectl apply -f dist/install.yaml), and the Helm chart with the same image, dist/ebb-VERSION.tgz (helm install ebb dist/ebb-*.tgz; helm push to an OCI registry)
release: image tools
	hack/release.sh $(IMAGE) $(TOOLS_BIN)/kubectl $$(hack/helm.sh) $(VERSION)

## tools: build the pinned tools that are not cached yet (a cold build takes about 10 minutes on 2 cores)
tools:
	@hack/tools.sh >/dev/null
	@hack/promtool.sh >/dev/null
	@hack/helm.sh >/dev/null
	@hack/prometheus.sh >/dev/null

## upstream-e2e: build Kubernetes' e2e.test (k8s.io/kubernetes/test/e2e) when it is not cached yet (a cold build takes about 15 minutes on 2 cores)
upstream-e2e:
	@hack/upstream-e2e.sh >/dev/null

## test: unit tests with -race, the supply-chain checks, then the end-to-end tests on the local cluster
test: tools unit supply-chain e2e

unit:
	$(GO) test -race -count=1 ./internal/... ./cmd/... ./bench/... ./config/... ./charts/...
	$(GO) test -run '^$$' -fuzz FuzzOneOddObjectBreaksNoOtherService -fuzztime 20s ./internal/lbmodel/
	$(GO) test -count=1 -tags ebb_image ./cmd/ebb/
	cd hack/image && $(GO) test -count=1 ./...
	cd hack/vulncheck && $(GO) test -count=1 ./...

## supply-chain: no advisory with a fix reachable from ebb's source or the image's binary (govulncheck, database from the pinned golang.org/x/vulndb), and the committed eBPF object is what its source builds to with the pinned clang
supply-chain: image
	env GOTOOLCHAIN=$(GO_TOOLCHAIN) hack/vulncheck.sh dist/ebb-linux-amd64
	hack/bpf.sh check

# One suite at a time (-p 1): each starts a cluster of its own, and the
# suites assert on timing (zero failed requests through a drain); two
# clusters on two cores made a suite fail now and then for want of CPU.
# The output is also kept in bin/e2e.log; on a failure, what each failed
# test logged is printed again last (hack/failures.sh), since a long run's
# end is what a CI log shows.
e2e: tools upstream-e2e build release
	rc=0; EBB_TOOLS_BIN=$(TOOLS_BIN) EBB_BIN=$(CURDIR)/bin/ebb EBB_UPSTREAM_E2E=$(UPSTREAM_E2E) $(GO) test -p 1 -count=1 -timeout $(E2E_TIMEOUT) -v ./test/e2e/... 2>&1 | tee bin/e2e.log || rc=$$?; \
	if [ $$rc -ne 0 ]; then hack/failures.sh bin/e2e.log; fi; exit $$rc

## conformance: Kubernetes' own LoadBalancer and Service e2e cases (k8s.io/kubernetes v1.36.3) against ebb on real kubelets; prints the table (bench/results/conformance.md) and, last, the JSON summary (bench/results/conformance.json)
conformance: tools upstream-e2e build release
	mkdir -p bench/results
	rm -f bench/results/conformance.md bench/results/conformance.json
	rc=0; EBB_TOOLS_BIN=$(TOOLS_BIN) EBB_BIN=$(CURDIR)/bin/ebb EBB_UPSTREAM_E2E=$(UPSTREAM_E2E) EBB_UPSTREAM_FOCUS=full EBB_UPSTREAM_SUMMARY=$(CURDIR)/bench/results/conformance.json \
		$(GO) test -count=1 -timeout 300m -v ./test/e2e/upstream/ || rc=$$?; \
	cat bench/results/conformance.md 2>/dev/null || echo "conformance: no table written (see the test's output above)"; \
	tail -1 bench/results/conformance.json 2>/dev/null || echo '{"error": "no summary written"}'; exit $$rc

## lint: go vet and staticcheck (pinned)
lint: tools
	@gofmt=$$($(GO) env GOROOT)/bin/gofmt; test -z "$$($$gofmt -l .)" || { echo "gofmt needed:"; $$gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(TOOLS_BIN)/staticcheck ./...

## generate: regenerate deepcopy, CRDs, webhook configurations and RBAC from the markers, the Helm chart's copy of them, and the eBPF kernel path's object
generate: tools bpf
	$(TOOLS_BIN)/controller-gen object paths=./api/...
	$(TOOLS_BIN)/controller-gen crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(TOOLS_BIN)/controller-gen webhook paths=./internal/webhook/... output:webhook:artifacts:config=config/webhook
	$(TOOLS_BIN)/controller-gen rbac:roleName=ebb-controller paths="{./internal/controller/...,./internal/webhook/...,./internal/cmd/controller/...,./internal/securemetrics/...}" output:rbac:artifacts:config=config/rbac/controller
	$(TOOLS_BIN)/controller-gen rbac:roleName=ebb-lb paths="{./internal/lbsync/...,./internal/securemetrics/...}" output:rbac:artifacts:config=config/rbac/lb
	$(TOOLS_BIN)/controller-gen rbac:roleName=ebb-node-agent paths="{./internal/cmd/nodeagent/...,./internal/securemetrics/...}" output:rbac:artifacts:config=config/rbac/node-agent
	# The Helm chart's copy of config/'s objects (charts/ebb/files).
	$(GO) test ./charts -run TestChartFilesAreGeneratedFromConfig -update-chart

## bpf: build the eBPF kernel path's object (internal/dataplane/bpf/ebb_lb.o, committed so that building ebb needs no clang) with the pinned clang-14 (hack/bpf.sh installs it with apt-get if missing)
bpf:
	hack/bpf.sh build

## verify: regenerate, fail if anything generated is out of date, lint, and the supply-chain checks
verify: generate lint supply-chain
	@git diff --exit-code -- . || { echo "generated files are out of date: run 'make generate' and commit"; exit 1; }
	$(TOOLS_BIN)/kubectl kustomize config/default >/dev/null
	$(TOOLS_BIN)/kubectl kustomize config/cert-manager >/dev/null
	$(GO) mod tidy -diff

## demo: drain a node of the local cluster under live traffic with ebb and the way clusters do it today, and report both side by side
demo: tools build release
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/ebb demo $(DEMO_FLAGS)

## fuzz: fuzz the data plane's configuration parser, and the load-balancer model with odd objects beside a good Service, for a minute each
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseConfig -fuzztime 60s -fuzzminimizetime 5s ./internal/dataplane/
	$(GO) test -run '^$$' -fuzz FuzzOneOddObjectBreaksNoOtherService -fuzztime 60s -fuzzminimizetime 5s ./internal/lbmodel/

## bench-dataplane: ebb's data plane against HAProxy 2.6, side by side (see docs/benchmarks.md)
bench-dataplane: build
	command -v haproxy >/dev/null || { apt-get update && apt-get install -y haproxy; }
	$(GO) build -o bin/bench-dataplane ./bench/dataplane
	taskset -c 1 bin/bench-dataplane -ebb bin/ebb

## bench-dataplane-routed: the same with the client, the load balancer and the backends on hosts of their own (network namespaces, the LB host routing), plus the kernel engine's eBPF path and a minimal eBPF NAT as the floor of a kernel path; then the kernel paths and HAProxy again with 20 pairs of slices per figure, which resolve a kernel path's few µs (needs root; installs HAProxy and clang with apt-get if missing)
bench-dataplane-routed: build
	command -v haproxy >/dev/null || { apt-get update && apt-get install -y haproxy; }
	command -v clang >/dev/null || { apt-get update && apt-get install -y clang; }
	$(GO) build -o bin/bench-dataplane ./bench/dataplane
	taskset -c 1 bin/bench-dataplane -ebb bin/ebb -topology routed
	taskset -c 1 bin/bench-dataplane -ebb bin/ebb -topology routed -only ebb-kernel,ebb-ebpf,minimal-ebpf,haproxy -pairs 20 -syscalls=false -out bench/results/dataplane-routed-kernel.json

## bench-service: Service create to first request, EndpointSlice change to data plane, 1,000 Services in one ebb lb, on real kubelets (needs root)
bench-service: tools build release
	$(GO) build -o bin/bench-service ./bench/service
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-service -dist dist -real-kubelets

## bench-cutover: leaving node -> last new connection (admin state vs probes only), spot eviction failures, on real kubelets (needs root)
bench-cutover: tools build release
	$(GO) build -o bin/bench-cutover ./bench/cutover
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-cutover -dist dist -real-kubelets

## bench-drain: a node drained under 1,000 req/s and 50 long-lived connections, ebb against kubectl drain, 3 runs each, on real kubelets (needs root)
bench-drain: tools build release
	$(GO) build -o bin/bench-drain ./bench/drain
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-drain -dist dist -real-kubelets

## bench-maintenance: API writes and reconciles per minute of ebb controller with 100 nodes, 3,000 pods and 5 NodeMaintenances, draining and steady
bench-maintenance: tools build release
	$(GO) build -o bin/bench-maintenance ./bench/maintenance
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-maintenance -dist dist

## bench-lb-lifecycle: restarts of one LB (ebb hand-off, HAProxy seamless reload, plain restart), rolling upgrades of the ebb lb DaemonSet and a maintenance of an LB host, under 1,000 req/s and 50 long-lived connections, 3 runs; the cluster part on real kubelets (needs root)
bench-lb-lifecycle: tools build release
	command -v haproxy >/dev/null || { apt-get update && apt-get install -y haproxy; }
	$(GO) build -o bin/bench-lb-lifecycle ./bench/lblifecycle
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-lb-lifecycle -ebb bin/ebb -dist dist -real-kubelets

## bench-failover: an LB host cut off under 1,000 req/s, announcing by BGP (FRR) and by L2 (ARP): time until new connections succeed again, failed requests, and a new Service's address reachable from the client; 3 runs each, on real kubelets (needs root)
bench-failover: tools build release
	$(GO) build -o bin/bench-failover ./bench/failover
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-failover -dist dist -real-kubelets

## bench-faults: the drain scenario (200 req/s, 10 long-lived connections, a NodeMaintenance from Drain to Complete) once without a fault, then once per fault injected at a seeded random moment of the drain (controller leader or both replicas killed, ebb lb or node-agent killed, kube-apiserver or etcd down, the LB host cut off the control plane): failed requests, reset connections, time to be whole again, what was left half done; on real kubelets (needs root; about 25 min)
bench-faults: tools build release
	command -v nft >/dev/null || { apt-get update && apt-get install -y nftables; }
	$(GO) build -o bin/bench-faults ./bench/faults
	EBB_TOOLS_BIN=$(TOOLS_BIN) bin/bench-faults -dist dist

## bench-abuse: hostile input against a standalone ebb lb: what a UDP flood from one source costs in memory and in legitimate new connections, forged L2 heartbeats refused, and the time to repair after nft flush ruleset (needs root; about 2 min)
bench-abuse: build
	command -v nft >/dev/null || { apt-get update && apt-get install -y nftables; }
	$(GO) build -o bin/bench-abuse ./bench/abuse
	bin/bench-abuse -ebb bin/ebb

clean:
	rm -rf bin dist
