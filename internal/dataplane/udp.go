package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// udpFlow is one client's flow, pinned to a backend through a connected
// socket until it is idle or its backend becomes ineligible.
type udpFlow struct {
	client   netip.AddrPort
	backend  *backend
	conn     net.Conn
	lastSeen atomic.Int64 // unix nanoseconds of the last client datagram
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
		flow := f.flowFor(set, client)
		if flow == nil {
			f.d.m.refused.WithLabelValues(set.cfg.Name, "no_backend").Inc()
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
func (f *frontend) flowFor(set *backendSet, client netip.AddrPort) *udpFlow {
	f.flowsMu.Lock()
	defer f.flowsMu.Unlock()
	if flow, ok := f.flows[client]; ok {
		if flow.backend.eligible() {
			return flow
		}
		f.d.m.udpMigrations.WithLabelValues(set.cfg.Name).Inc()
		f.endFlowLocked(flow)
	}
	b, conn := f.dialBackend(set, "udp", client.Addr())
	if b == nil {
		return nil
	}
	flow := &udpFlow{client: client, backend: b, conn: conn}
	f.flows[client] = flow
	b.active.Add(1)
	b.m.active.Inc()
	b.m.total.Inc()
	go f.udpReplies(flow, set.cfg.IdleTimeout.Duration)
	return flow
}

// udpReplies sends the backend's datagrams back to the client until the
// flow has been idle (no client datagram) for idleTimeout.
func (f *frontend) udpReplies(flow *udpFlow, idleTimeout time.Duration) {
	buf := make([]byte, 64<<10)
	for {
		_ = flow.conn.SetReadDeadline(time.Now().Add(idleTimeout))
		n, err := flow.conn.Read(buf)
		if err == nil {
			if _, err := f.udp.WriteToUDPAddrPort(buf[:n], flow.client); err == nil {
				flow.backend.m.toClient.Add(float64(n))
			}
			continue
		}
		if flow.closed.Load() {
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, flow.lastSeen.Load())) < idleTimeout {
			continue // the client is still sending
		}
		// Idle, or an ICMP error from the backend (port unreachable): end
		// the flow; the client's next datagram starts a new one.
		f.flowsMu.Lock()
		if f.flows[flow.client] == flow {
			f.endFlowLocked(flow)
		}
		f.flowsMu.Unlock()
		return
	}
}

// endFlowLocked closes a flow; f.flowsMu must be held.
func (f *frontend) endFlowLocked(flow *udpFlow) {
	if flow.closed.Swap(true) {
		return
	}
	delete(f.flows, flow.client)
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
