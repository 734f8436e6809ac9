package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// SkipReason says why Apply left a frontend out.
type SkipReason string

const (
	// SkipInvalid: the frontend's configuration is invalid.
	SkipInvalid SkipReason = "Invalid"
	// SkipAddressConflict: another frontend has the same address, port and
	// protocol. The one already serving keeps it; between new ones, the
	// first in the configuration.
	SkipAddressConflict SkipReason = "AddressConflict"
	// SkipListenFailed: the socket could not be opened (the port is held
	// by another process, the address family is not configured, ...).
	SkipListenFailed SkipReason = "ListenFailed"
	// SkipKernelFailed: the kernel engine's nftables table could not be
	// installed (no CAP_NET_ADMIN, no nf_tables in the kernel, ...).
	SkipKernelFailed SkipReason = "KernelFailed"
	// SkipKernelFull: the kernel engine's eBPF path has no room left in
	// its fixed-size maps for the frontend (the others are served).
	SkipKernelFull SkipReason = "KernelFull"
)

// SkippedFrontend is a frontend that Apply could not serve.
type SkippedFrontend struct {
	Name   string
	Reason SkipReason
	Err    error
}

func (s SkippedFrontend) Error() string {
	return fmt.Sprintf("frontend %q: %s: %v", s.Name, s.Reason, s.Err)
}

// ApplyResult is what Apply did not apply.
type ApplyResult struct {
	Skipped []SkippedFrontend
}

// admit validates each frontend of cfg on its own and settles conflicts
// between frontends that claim one socket. It returns the normalised
// frontends that may be served, in cfg's order, and the others.
func (d *DataPlane) admit(cfg Config) ([]Frontend, []SkippedFrontend) {
	var skipped []SkippedFrontend
	valid := make([]Frontend, 0, len(cfg.Frontends))
	for i, f := range cfg.Frontends {
		nf, err := f.validate()
		if err != nil {
			name := f.Name
			if name == "" {
				name = fmt.Sprintf("frontends[%d]", i)
			}
			skipped = append(skipped, SkippedFrontend{Name: name, Reason: SkipInvalid, Err: err})
			continue
		}
		named := nf.Engine
		nf.Engine = d.engineFor(&nf)
		nf.auto = nf.Engine == EngineKernel && (named == EngineAuto || named == "" && d.engine == EngineAuto)
		if nf.Engine == EngineKernel {
			if why := d.kernelUnsupported(&nf); why != "" {
				which := "engine Kernel"
				if named == "" {
					which += " (the data plane's default)"
				}
				skipped = append(skipped, SkippedFrontend{Name: nf.Name, Reason: SkipInvalid, Err: fmt.Errorf("%s: %s", which, why)})
				continue
			}
		}
		valid = append(valid, nf)
	}
	// A frontend already serving a socket keeps it.
	out := make([]Frontend, 0, len(valid))
	owner := make(map[frontendKey]string, len(valid))
	for _, f := range valid {
		if running, ok := d.frontends[f.key()]; ok && running.set.Load().cfg.Name == f.Name {
			owner[f.key()] = f.Name
		}
	}
	names := make(map[string]bool, len(valid))
	for _, f := range valid {
		k := f.key()
		switch first, ok := owner[k]; {
		case names[f.Name]:
			skipped = append(skipped, SkippedFrontend{Name: f.Name, Reason: SkipInvalid, Err: fmt.Errorf("name %q is used twice: frontend names must be unique", f.Name)})
			continue
		case !ok:
			owner[k] = f.Name
		case first != f.Name:
			skipped = append(skipped, SkippedFrontend{Name: f.Name, Reason: SkipAddressConflict, Err: fmt.Errorf("%s is served by frontend %q: one frontend per address, port and protocol", k, first)})
			continue
		}
		names[f.Name] = true
		out = append(out, f)
	}
	return out, skipped
}

// engineFor resolves the engine of a valid frontend: its own, else the
// data plane's default; Auto becomes the kernel when the frontend needs
// nothing only the proxy can do.
func (d *DataPlane) engineFor(f *Frontend) Engine {
	e := f.Engine
	if e == "" {
		e = d.engine
	}
	if e == EngineAuto {
		if d.autoKernelFailed == nil && d.kernelUnsupported(f) == "" {
			return EngineKernel
		}
		return EngineProxy
	}
	return e
}

// openListeners binds the sockets of the frontends that are not served
// yet. A socket that cannot be opened skips its frontend only.
func (d *DataPlane) openListeners(frontends []Frontend) (map[frontendKey]any, []SkippedFrontend) {
	opened := map[frontendKey]any{}
	var skipped []SkippedFrontend
	for _, fc := range frontends {
		k := fc.key()
		if _, ok := d.frontends[k]; ok {
			continue
		}
		if fc.Engine == EngineKernel {
			opened[k] = nil // no socket: the kernel forwards its flows
			continue
		}
		if l := d.takeInherited(k); l != nil {
			opened[k] = l
			continue
		}
		l, err := d.listen(k)
		if err != nil {
			skipped = append(skipped, SkippedFrontend{Name: fc.Name, Reason: SkipListenFailed, Err: fmt.Errorf("listening on %s: %w", k, err)})
			continue
		}
		opened[k] = l
	}
	return opened, skipped
}

// listen opens a frontend's socket: a raw one for the event loop (TCP
// unless Options.GoroutineProxy), else one of Go's net package (see
// listenNet).
func (d *DataPlane) listen(k frontendKey) (any, error) {
	if k.protocol == TCP && d.loop != nil {
		return listenLoop(k)
	}
	return listenNet(k)
}

// listenNet opens a frontend's socket with free-bind (IP_FREEBIND,
// IPV6_FREEBIND): the bind succeeds whether or not the address is
// configured on the host yet, so that a load-balancer address needs no
// manual set-up and the order in which the host learns it does not matter.
// Traffic reaches the socket once the host accepts the address as local
// (see internal/vipaddr).
func listenNet(k frontendKey) (any, error) {
	// No TCP keep-alive on accepted sockets: four system calls per
	// connection, set per frontend instead (Frontend.TCPKeepAlive).
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if k.addr.Addr().Is4() {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setting free-bind: %w", serr)
		}
		return nil
	}}
	network := "tcp4"
	if k.addr.Addr().Is6() {
		network = "tcp6"
	}
	if k.protocol == UDP {
		network = "udp" + network[3:]
		return lc.ListenPacket(context.Background(), network, k.addr.String())
	}
	return lc.Listen(context.Background(), network, k.addr.String())
}

// Addresses returns the addresses of the frontends being served, each once,
// sorted: the addresses the host must accept traffic for.
func (d *DataPlane) Addresses() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for k := range d.frontends {
		if a := k.addr.Addr(); !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// ServedPort is where a frontend takes traffic: its address and port, and
// its protocol.
type ServedPort struct {
	Protocol Protocol
	AddrPort netip.AddrPort
}

// Ports returns where the frontends being served take traffic, sorted:
// what must reach the host on its load-balancer addresses (the rest need
// not, see internal/vipguard).
func (d *DataPlane) Ports() []ServedPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]ServedPort, 0, len(d.frontends))
	for k := range d.frontends {
		out = append(out, ServedPort{Protocol: k.protocol, AddrPort: k.addr})
	}
	slices.SortFunc(out, func(a, b ServedPort) int {
		if c := a.AddrPort.Compare(b.AddrPort); c != 0 {
			return c
		}
		return strings.Compare(string(a.Protocol), string(b.Protocol))
	})
	return out
}

// Err joins the skipped frontends' errors: nil when every frontend applied.
func (r ApplyResult) Err() error {
	errs := make([]error, len(r.Skipped))
	for i, s := range r.Skipped {
		errs[i] = s
	}
	return errors.Join(errs...)
}
