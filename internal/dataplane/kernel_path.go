package dataplane

import (
	"fmt"
	"net/netip"
)

// KernelPath says how the kernel engine forwards its frontends' flows.
type KernelPath string

const (
	// KernelPathNftables translates flows with nftables NAT rules and
	// carries them in conntrack (kernel.go): every protocol and family
	// the engine serves, and clients on the load balancer's host too.
	KernelPathNftables KernelPath = "nftables"
	// KernelPathEBPF translates flows with a tc program and a flow table
	// of its own, without conntrack (kernel_ebpf.go): IPv4 TCP frontends,
	// clients and backends on other hosts. It costs a new connection
	// about half the CPU nftables does (17 to 19 µs against 29 to 37 µs
	// system-wide, docs/benchmarks.md).
	KernelPathEBPF KernelPath = "ebpf"
)

// kernelPath is what the kernel engine needs of a way to forward flows in
// the kernel. The frontends it is given are the kernel engine's.
type kernelPath interface {
	// unsupported says why this path cannot serve a frontend the kernel
	// engine otherwise could, or "".
	unsupported(f *Frontend) string
	// sync makes the kernel forward the frontends' new flows as their
	// backend sets say; flows already forwarded keep their backend.
	// Without prepare it may leave work for the owners' next changes
	// undone, and says with stale whether a sync with prepare should
	// follow.
	sync(frontends []*frontend, m *metrics, prepare bool) (stale bool, err error)
	// fit picks the frontends the path has room for, and says for each
	// of the others why not.
	fit(frontends []*frontend) (fits []*frontend, full map[*frontend]string, err error)
	// flipOwner applies one owner's admin-state change on a fast path if
	// it can, and reports whether it did; sync does it otherwise.
	flipOwner(frontends []*frontend, owner string, m *metrics) (bool, error)
	// activeFlows counts the open flows of the wanted frontends and
	// backends (each with its backend's flow label, which the nftables
	// path's conntrack entries carry).
	activeFlows(want map[flowKey]flowLabel) (map[flowKey]int64, error)
	// dropFlows ends the flows frontend fe forwards to backend (its
	// drain timeout ran out).
	dropFlows(fe frontendKey, backend netip.AddrPort) error
	// hasState reports whether the kernel holds this path's state for
	// the namespace: tables or pins, left by this process or another.
	hasState() (bool, error)
	// remove stops the kernel forwarding anything of the engine's.
	remove() error
	// close lets go of what the process holds; the kernel keeps
	// forwarding, so that a restart of ebb lb drops no flow.
	close()
}

// otherKernelPath is the path opts do not name, whose state a predecessor
// may have left (settleKernelLocked).
func otherKernelPath(opts Options) kernelPath {
	other := opts
	other.KernelPath = KernelPathEBPF
	if opts.KernelPath == KernelPathEBPF {
		other.KernelPath = KernelPathNftables
	}
	k, _ := newKernelPath(other)
	return k
}

// newKernelPath returns the kernel path opts name.
func newKernelPath(opts Options) (kernelPath, error) {
	switch opts.KernelPath {
	case "", KernelPathNftables:
		return newKernelEngine(opts.KernelTable, opts.NetNS, opts.Logger), nil
	case KernelPathEBPF:
		return newEBPFPath(opts), nil
	default:
		return nil, fmt.Errorf("kernel path %q is not supported: use nftables or ebpf", opts.KernelPath)
	}
}

// unsupported: the nftables path serves whatever the kernel engine can.
func (k *kernelEngine) unsupported(*Frontend) string { return "" }

// fit: the nftables path's sets and maps grow as needed.
func (k *kernelEngine) fit(frontends []*frontend) ([]*frontend, map[*frontend]string, error) {
	return frontends, nil, nil
}

// kernelUnsupported says why the kernel engine, on this data plane's
// kernel path, cannot serve a frontend, or "".
func (d *DataPlane) kernelUnsupported(f *Frontend) string {
	if why := kernelUnsupported(f); why != "" {
		return why
	}
	return d.kernel.unsupported(f)
}
