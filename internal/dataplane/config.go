package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Config is the whole desired state of the data plane. Apply makes it true
// atomically.
type Config struct {
	Frontends []Frontend `json:"frontends"`
}

// Protocol is a frontend's transport.
type Protocol string

// Protocols.
const (
	TCP Protocol = "TCP"
	UDP Protocol = "UDP"
)

// Balancing chooses the backend of a new connection.
type Balancing string

// Balancing algorithms.
const (
	// RoundRobin takes eligible backends in turn, in proportion to weight.
	RoundRobin Balancing = "RoundRobin"
	// LeastConnections takes the eligible backend with the fewest active
	// connections per unit of weight.
	LeastConnections Balancing = "LeastConnections"
	// ClientIP hashes the client address onto a Maglev table, so that a
	// client keeps its backend and a backend change moves only that
	// backend's share of clients (session affinity).
	ClientIP Balancing = "ClientIP"
)

// AdminState is an operator's override of a backend's health, with Azure
// Load Balancer's semantics.
type AdminState string

// Admin states.
const (
	// AdminNone lets the health probe decide (the default).
	AdminNone AdminState = "None"
	// AdminDown sends the backend no new connection, whatever its probe
	// says; established TCP connections continue until they close; UDP
	// flows move to another backend.
	AdminDown AdminState = "Down"
	// AdminUp sends the backend new connections whatever its probe says.
	AdminUp AdminState = "Up"
)

// Frontend is one listening address (a VIP and port) with its backends.
type Frontend struct {
	// Name identifies the frontend in metrics and logs (e.g. ns/svc:port).
	Name     string   `json:"name"`
	Address  string   `json:"address"`
	Port     uint16   `json:"port"`
	Protocol Protocol `json:"protocol,omitempty"`
	// Balancing defaults to RoundRobin.
	Balancing Balancing `json:"balancing,omitempty"`
	// SourceRanges, when set, are the only client prefixes accepted
	// (loadBalancerSourceRanges); others are refused.
	SourceRanges []string `json:"sourceRanges,omitempty"`
	// ProxyProtocol sends a PROXY protocol v2 header to the backend first,
	// carrying the client's address (TCP only).
	ProxyProtocol bool `json:"proxyProtocol,omitempty"`
	// ConnectTimeout bounds a dial to a backend. Default 5s.
	ConnectTimeout Duration `json:"connectTimeout,omitempty"`
	// IdleTimeout closes a TCP connection (or forgets a UDP flow) after no
	// traffic for this long. Default 4m for TCP (Azure's), 30s for UDP.
	IdleTimeout Duration `json:"idleTimeout,omitempty"`
	// DrainTimeout, if set, closes the connections of a removed backend (or
	// frontend) after this long; unset, they last until they close.
	DrainTimeout Duration `json:"drainTimeout,omitempty"`
	// TCPKeepAlive, if set, turns on TCP keep-alive probes on both sides of
	// each connection after this much quiet (for peers that vanish without
	// a FIN behind a NAT that forgets them). Unset, none are sent: each
	// socket option costs a system call per connection.
	TCPKeepAlive Duration `json:"tcpKeepAlive,omitempty"`
	// HealthCheck probes the backends; unset, backends are always healthy.
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`
	// Engine serves the frontend: Proxy, Kernel or Auto (the kernel when
	// the frontend needs nothing only the proxy can do). Unset: the data
	// plane's default (Options.Engine, `ebb lb --engine`).
	Engine   Engine    `json:"engine,omitempty"`
	Backends []Backend `json:"backends"`

	// auto: engine Auto gave the frontend to the kernel (set by admit).
	auto bool
}

// Backend is one destination of a frontend.
type Backend struct {
	Address string `json:"address"`
	Port    uint16 `json:"port"`
	// Weight is the backend's share relative to the others. Default 1.
	Weight int `json:"weight,omitempty"`
	// AdminState defaults to None.
	AdminState AdminState `json:"adminState,omitempty"`
	// Owner labels the backend in metrics (the node name).
	Owner string `json:"owner,omitempty"`
	// ProbeAddress and ProbePort, when set, are probed instead of the
	// traffic address (a node's health port rather than its nodePort).
	ProbeAddress string `json:"probeAddress,omitempty"`
	ProbePort    uint16 `json:"probePort,omitempty"`
}

// ProbeProtocol is how a health check probes.
type ProbeProtocol string

// Probe protocols.
const (
	ProbeHTTP ProbeProtocol = "HTTP"
	ProbeTCP  ProbeProtocol = "TCP"
)

// HealthCheck probes every backend of a frontend.
type HealthCheck struct {
	Protocol ProbeProtocol `json:"protocol"`
	// Path is the HTTP path (HTTP only). Default "/". 200 means healthy.
	Path string `json:"path,omitempty"`
	// Port, when set, is probed instead of each backend's traffic port
	// (a backend's ProbePort overrides it).
	Port uint16 `json:"port,omitempty"`
	// Interval between probes. Default 5s (Azure's).
	Interval Duration `json:"interval,omitempty"`
	// Timeout of one probe. Default: the interval, at most 5s.
	Timeout Duration `json:"timeout,omitempty"`
	// UnhealthyThreshold consecutive failures take a backend out. Default 2.
	UnhealthyThreshold int `json:"unhealthyThreshold,omitempty"`
	// HealthyThreshold consecutive successes bring it back. Default 1.
	HealthyThreshold int `json:"healthyThreshold,omitempty"`
}

// Duration is a time.Duration written as "5s" in YAML and JSON.
type Duration struct{ time.Duration }

// UnmarshalJSON reads "250ms", "5s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		v, err := time.ParseDuration(s[1 : len(s)-1])
		if err != nil {
			return fmt.Errorf("invalid duration %s: write it like \"5s\" or \"250ms\"", s)
		}
		d.Duration = v
		return nil
	}
	var secs float64
	if _, err := fmt.Sscanf(s, "%g", &secs); err != nil {
		return fmt.Errorf("invalid duration %s: write it like \"5s\" or \"250ms\"", s)
	}
	d.Duration = time.Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a string like "5s".
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// Defaults.
const (
	DefaultConnectTimeout     = 5 * time.Second
	DefaultTCPIdleTimeout     = 4 * time.Minute
	DefaultUDPIdleTimeout     = 30 * time.Second
	DefaultProbeInterval      = 5 * time.Second
	DefaultUnhealthyThreshold = 2
	DefaultHealthyThreshold   = 1
	maxWeight                 = 256
)

// frontendKey identifies a listening socket.
type frontendKey struct {
	addr     netip.AddrPort
	protocol Protocol
}

func (k frontendKey) String() string { return string(k.protocol) + "/" + k.addr.String() }

// Validate checks a configuration and fills in defaults, returning the
// normalised copy. Every error names the frontend and field and says what
// is allowed.
func (c Config) Validate() (Config, error) {
	out := Config{Frontends: make([]Frontend, len(c.Frontends))}
	var errs []error
	seenKeys := make(map[frontendKey]string, len(c.Frontends))
	seenNames := make(map[string]bool, len(c.Frontends))
	for i, f := range c.Frontends {
		nf, err := f.validate()
		where := fmt.Sprintf("frontends[%d]", i)
		if f.Name != "" {
			where += fmt.Sprintf(" (%s)", f.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if seenNames[nf.Name] {
			errs = append(errs, fmt.Errorf("%s: name %q is used twice: frontend names must be unique", where, nf.Name))
		}
		seenNames[nf.Name] = true
		k := nf.key()
		if other, ok := seenKeys[k]; ok {
			errs = append(errs, fmt.Errorf("%s: %s is also served by frontend %q: one frontend per address, port and protocol", where, k, other))
		}
		seenKeys[k] = nf.Name
		out.Frontends[i] = nf
	}
	return out, errors.Join(errs...)
}

func (f Frontend) key() frontendKey {
	addr, _ := netip.ParseAddr(f.Address)
	return frontendKey{addr: netip.AddrPortFrom(addr.Unmap(), f.Port), protocol: f.Protocol}
}

func (f Frontend) validate() (Frontend, error) {
	if f.Name == "" {
		return f, errors.New("name is required")
	}
	addr, err := netip.ParseAddr(f.Address)
	if err != nil {
		return f, fmt.Errorf("address %q is not an IP address (IPv4 like 10.96.255.1 or IPv6 like fd00::1)", f.Address)
	}
	f.Address = addr.Unmap().String()
	if f.Port == 0 {
		return f, errors.New("port is required (1-65535)")
	}
	switch f.Protocol {
	case "":
		f.Protocol = TCP
	case TCP, UDP:
	default:
		return f, fmt.Errorf("protocol %q is not supported: use TCP or UDP", f.Protocol)
	}
	switch f.Balancing {
	case "":
		f.Balancing = RoundRobin
	case RoundRobin, LeastConnections, ClientIP:
	default:
		return f, fmt.Errorf("balancing %q is not supported: use RoundRobin, LeastConnections or ClientIP", f.Balancing)
	}
	if f.ProxyProtocol && f.Protocol != TCP {
		return f, errors.New("proxyProtocol is supported for TCP frontends only")
	}
	switch f.Engine {
	case "", EngineProxy, EngineAuto:
	case EngineKernel:
		if why := kernelUnsupported(&f); why != "" {
			return f, fmt.Errorf("engine Kernel: %s", why)
		}
	default:
		return f, fmt.Errorf("engine %q is not supported: use Proxy, Kernel or Auto", f.Engine)
	}
	for _, r := range f.SourceRanges {
		if _, err := netip.ParsePrefix(r); err != nil {
			return f, fmt.Errorf("sourceRanges: %q is not a CIDR prefix like 192.0.2.0/24", r)
		}
	}
	if f.ConnectTimeout.Duration < 0 || f.IdleTimeout.Duration < 0 || f.DrainTimeout.Duration < 0 || f.TCPKeepAlive.Duration < 0 {
		return f, errors.New("timeouts must not be negative")
	}
	if f.ConnectTimeout.Duration == 0 {
		f.ConnectTimeout.Duration = DefaultConnectTimeout
	}
	if f.IdleTimeout.Duration == 0 {
		f.IdleTimeout.Duration = DefaultTCPIdleTimeout
		if f.Protocol == UDP {
			f.IdleTimeout.Duration = DefaultUDPIdleTimeout
		}
	}
	if f.HealthCheck != nil {
		hc, err := f.HealthCheck.validate()
		if err != nil {
			return f, fmt.Errorf("healthCheck: %w", err)
		}
		f.HealthCheck = &hc
	}
	backends := make([]Backend, len(f.Backends))
	seen := newAddrSet(len(f.Backends))
	for i, b := range f.Backends {
		nb, err := b.validate()
		if err != nil {
			return f, fmt.Errorf("backends[%d]: %w", i, err)
		}
		ap := nb.AddrPort()
		if !seen.add(ap) {
			return f, fmt.Errorf("backends[%d]: %s is listed twice", i, ap)
		}
		backends[i] = nb
	}
	f.Backends = backends
	return f, nil
}

// addrSet finds an address listed twice: by looking through a slice for
// the few backends most frontends have (a map for each of them was a
// third of what an Apply allocated), by a map past smallAddrSet.
type addrSet struct {
	few  []netip.AddrPort
	many map[netip.AddrPort]bool
}

const smallAddrSet = 32

func newAddrSet(n int) addrSet {
	if n > smallAddrSet {
		return addrSet{many: make(map[netip.AddrPort]bool, n)}
	}
	return addrSet{few: make([]netip.AddrPort, 0, n)}
}

// add adds ap and reports whether it was not there yet.
func (s *addrSet) add(ap netip.AddrPort) bool {
	if s.many != nil {
		if s.many[ap] {
			return false
		}
		s.many[ap] = true
		return true
	}
	if slices.Contains(s.few, ap) {
		return false
	}
	s.few = append(s.few, ap)
	return true
}

func (b Backend) validate() (Backend, error) {
	addr, err := netip.ParseAddr(b.Address)
	if err != nil {
		return b, fmt.Errorf("address %q is not an IP address", b.Address)
	}
	if addr.Is4In6() {
		b.Address = addr.Unmap().String()
	}
	if b.Port == 0 {
		return b, errors.New("port is required (1-65535)")
	}
	switch {
	case b.Weight == 0:
		b.Weight = 1
	case b.Weight < 0 || b.Weight > maxWeight:
		return b, fmt.Errorf("weight %d is out of range: use 1 to %d", b.Weight, maxWeight)
	}
	switch b.AdminState {
	case "":
		b.AdminState = AdminNone
	case AdminNone, AdminDown, AdminUp:
	default:
		return b, fmt.Errorf("adminState %q is not supported: use None, Down or Up", b.AdminState)
	}
	if b.ProbeAddress != "" {
		pa, err := netip.ParseAddr(b.ProbeAddress)
		if err != nil {
			return b, fmt.Errorf("probeAddress %q is not an IP address", b.ProbeAddress)
		}
		b.ProbeAddress = pa.Unmap().String()
	}
	return b, nil
}

// AddrPort is the backend's address and port as the data plane keys it
// (BackendStatus.Address): an IPv4-mapped IPv6 address is unmapped.
func (b Backend) AddrPort() netip.AddrPort {
	addr, _ := netip.ParseAddr(b.Address)
	return netip.AddrPortFrom(addr.Unmap(), b.Port)
}

func (h HealthCheck) validate() (HealthCheck, error) {
	switch h.Protocol {
	case ProbeHTTP:
		if h.Path == "" {
			h.Path = "/"
		}
		if h.Path[0] != '/' {
			return h, fmt.Errorf("path %q must start with /", h.Path)
		}
	case ProbeTCP:
		if h.Path != "" {
			return h, errors.New("path applies to HTTP probes only")
		}
	default:
		return h, fmt.Errorf("protocol %q is not supported: use HTTP or TCP", h.Protocol)
	}
	if h.Interval.Duration < 0 || h.Timeout.Duration < 0 || h.UnhealthyThreshold < 0 || h.HealthyThreshold < 0 {
		return h, errors.New("interval, timeout and thresholds must not be negative")
	}
	if h.Interval.Duration == 0 {
		h.Interval.Duration = DefaultProbeInterval
	}
	if h.Interval.Duration < 10*time.Millisecond {
		return h, fmt.Errorf("interval %s is too short: use 10ms or more", h.Interval.Duration)
	}
	if h.Timeout.Duration == 0 {
		h.Timeout.Duration = min(h.Interval.Duration, 5*time.Second)
	}
	if h.UnhealthyThreshold == 0 {
		h.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if h.HealthyThreshold == 0 {
		h.HealthyThreshold = DefaultHealthyThreshold
	}
	return h, nil
}
