package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The proxy's UDP flows are bounded, since anyone who reaches a UDP
// frontend can start one per source address and port (and spoof the
// address): each costs a connected socket, a goroutine and a slot in the
// backends' counts until it has been idle for the frontend's idle timeout.
// Defaults of UDPLimits.
const (
	DefaultUDPFlows            = 16384
	DefaultUDPFlowsPerFrontend = 8192
	DefaultUDPFlowsPerSource   = 256
	// udpUnansweredIdle ends a flow whose backend never answered after
	// this long without a client datagram (or the frontend's idle
	// timeout, if shorter), as conntrack gives unreplied UDP a shorter
	// timeout: a scan or a flood's flows go quickly, a conversation's
	// stay.
	udpUnansweredIdle = 5 * time.Second
	// udpMaxDatagram is the largest UDP payload a read can return (IPv6's
	// 65,527 bytes; jumbograms aside).
	udpMaxDatagram = 65535
)

// UDPLimits bound the proxy engine's UDP flows. A datagram that would start
// a flow beyond a limit is dropped, counted in ebb_dataplane_refused_total
// (reason udp_flows_total, udp_flows_frontend or udp_flows_source); the
// flows already there are served as before.
type UDPLimits struct {
	// Total bounds the flows of every frontend together. Default:
	// DefaultUDPFlows.
	Total int
	// PerFrontend bounds one frontend's flows, so that a flood of one
	// leaves room for the others. Default: DefaultUDPFlowsPerFrontend.
	PerFrontend int
	// PerSource bounds one client address's flows on one frontend (one
	// client cycling source ports). Default: DefaultUDPFlowsPerSource.
	PerSource int
}

func (l UDPLimits) withDefaults() UDPLimits {
	if l.Total <= 0 {
		l.Total = DefaultUDPFlows
	}
	if l.PerFrontend <= 0 {
		l.PerFrontend = DefaultUDPFlowsPerFrontend
	}
	if l.PerSource <= 0 {
		l.PerSource = DefaultUDPFlowsPerSource
	}
	return l
}

// udpFlow is one client's flow, pinned to a backend through a connected
// socket until it is idle or its backend becomes ineligible.
type udpFlow struct {
	client   netip.AddrPort
	backend  *backend
	conn     net.Conn
	lastSeen atomic.Int64 // unix nanoseconds of the last client datagram
	// answered: the backend sent at least one datagram back.
	answered atomic.Bool
	closed   atomic.Bool
}

// udpLoop reads client datagrams and forwards each along its flow.
func (f *frontend) udpLoop() {
	buf := make([]byte, 64<<10)
	for {
		n, client, err := f.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || f.stopReading.Load() {
				return
			}
			continue
		}
		set := f.set.Load()
		if !set.allowed(client.Addr()) {
			f.d.m.refused.WithLabelValues(set.cfg.Name, "source_range").Inc()
			continue
		}
		flow, refused := f.flowFor(set, client)
		if flow == nil {
			f.d.m.refused.WithLabelValues(set.cfg.Name, refused).Inc()
			continue
		}
		flow.lastSeen.Store(time.Now().UnixNano())
		if _, err := flow.conn.Write(buf[:n]); err == nil {
			flow.backend.m.toBackend.Add(float64(n))
		}
	}
}

// flowFor returns the client's flow, moving it to another backend if its
// backend can no longer take traffic (admin Down, unhealthy or removed).
// Without a flow it says why: a limit, or no backend.
func (f *frontend) flowFor(set *backendSet, client netip.AddrPort) (*udpFlow, string) {
	f.flowsMu.Lock()
	defer f.flowsMu.Unlock()
	if flow, ok := f.flows[client]; ok {
		if flow.backend.eligible() {
			return flow, ""
		}
		f.d.m.udpMigrations.WithLabelValues(set.cfg.Name).Inc()
		f.endFlowLocked(flow)
	}
	if refused := f.admitFlowLocked(client.Addr()); refused != "" {
		return nil, refused
	}
	_, b, conn, _ := f.dialBackend(set, "udp", client.Addr())
	if b == nil {
		f.releaseFlowLocked(client.Addr())
		return nil, "no_backend"
	}
	flow := &udpFlow{client: client, backend: b, conn: conn}
	f.flows[client] = flow
	b.active.Add(1)
	b.m.active.Inc()
	b.m.total.Inc()
	go f.udpReplies(flow, set.cfg.IdleTimeout.Duration)
	return flow, ""
}

// admitFlowLocked takes a place for a new flow of the client address
// within the limits, or says which limit refuses it; f.flowsMu is held.
func (f *frontend) admitFlowLocked(client netip.Addr) string {
	limits := f.d.udpLimits
	switch {
	case len(f.flows) >= limits.PerFrontend:
		return "udp_flows_frontend"
	case f.flowsBySource[client] >= limits.PerSource:
		return "udp_flows_source"
	}
	if f.d.udpFlows.Add(1) > int64(limits.Total) {
		f.d.udpFlows.Add(-1)
		return "udp_flows_total"
	}
	f.flowsBySource[client]++
	f.d.m.udpFlows.Inc()
	return ""
}

// releaseFlowLocked gives back a place admitFlowLocked took.
func (f *frontend) releaseFlowLocked(client netip.Addr) {
	f.d.udpFlows.Add(-1)
	f.d.m.udpFlows.Dec()
	if f.flowsBySource[client]--; f.flowsBySource[client] <= 0 {
		delete(f.flowsBySource, client)
	}
}

// udpReplies sends the backend's datagrams back to the client until the
// flow has been idle (no client datagram) for idleTimeout, or for
// udpUnansweredIdle while the backend never answered.
//
// It waits for the backend with no buffer of its own: a buffer is taken
// from the data plane's pool only once a datagram is there to read (the
// socket's raw read), so an idle flow costs a goroutine and a socket, not
// 64 KiB.
func (f *frontend) udpReplies(flow *udpFlow, idleTimeout time.Duration) {
	raw, err := syscallConn(flow.conn)
	if err != nil {
		f.d.log.Error(err, "Reading a UDP backend's replies", "backend", flow.backend.addr)
		f.endFlow(flow)
		return
	}
	for {
		idle := idleTimeout
		if !flow.answered.Load() {
			idle = min(idle, f.d.udpUnansweredIdle)
		}
		_ = flow.conn.SetReadDeadline(time.Now().Add(idle))
		var (
			buf     *[]byte
			n       int
			readErr error
		)
		err := raw.Read(func(fd uintptr) bool {
			buf = f.d.udpBuffers.Get().(*[]byte)
			n, readErr = unix.Read(int(fd), *buf)
			if errors.Is(readErr, unix.EAGAIN) {
				f.d.udpBuffers.Put(buf)
				buf = nil
				return false // wait until readable
			}
			return true
		})
		if buf != nil {
			// Sent outside the read, which holds the flow's socket: a
			// send that waits for room must not keep endFlowLocked's
			// Close (under flowsMu) waiting.
			if readErr == nil {
				flow.answered.Store(true)
				if _, err := f.udp.WriteToUDPAddrPort((*buf)[:n], flow.client); err == nil {
					flow.backend.m.toClient.Add(float64(n))
				}
			}
			f.d.udpBuffers.Put(buf)
		}
		if err == nil && readErr == nil {
			continue
		}
		if flow.closed.Load() {
			return
		}
		var ne net.Error
		if readErr == nil && errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, flow.lastSeen.Load())) < idle {
			continue // the client is still sending
		}
		// Idle, or an ICMP error from the backend (port unreachable): end
		// the flow; the client's next datagram starts a new one.
		f.endFlow(flow)
		return
	}
}

// syscallConn is the raw socket of a backend connection.
func syscallConn(c net.Conn) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errors.New("the backend connection has no socket")
	}
	return sc.SyscallConn()
}

// newUDPBuffers is the pool of buffers the flows read their backends'
// datagrams into.
func newUDPBuffers() *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]byte, udpMaxDatagram)
		return &b
	}}
}

// endFlow ends the flow unless another already replaced it.
func (f *frontend) endFlow(flow *udpFlow) {
	f.flowsMu.Lock()
	defer f.flowsMu.Unlock()
	if f.flows[flow.client] == flow {
		f.endFlowLocked(flow)
	}
}

// endFlowLocked closes a flow; f.flowsMu must be held.
func (f *frontend) endFlowLocked(flow *udpFlow) {
	if flow.closed.Swap(true) {
		return
	}
	delete(f.flows, flow.client)
	f.releaseFlowLocked(flow.client.Addr())
	_ = flow.conn.Close()
	flow.backend.active.Add(-1)
	flow.backend.m.active.Dec()
}

// closeFlows ends every UDP flow of the frontend.
func (f *frontend) closeFlows() {
	f.flowsMu.Lock()
	defer f.flowsMu.Unlock()
	for _, flow := range f.flows {
		f.endFlowLocked(flow)
	}
}
