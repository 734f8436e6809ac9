package nodeproxy

import (
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// slicesFunc returns a Service's EndpointSlices.
type slicesFunc func(namespace, service string) []*discoveryv1.EndpointSlice

const (
	dialTimeout    = 2 * time.Second
	udpIdleTimeout = 30 * time.Second
)

// tcpListener forwards a node port's TCP connections to endpoints.
type tcpListener struct {
	ln     net.Listener
	target atomic.Pointer[target]
	slices slicesFunc
	faults *faults

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func listenTCP(addr string, t target, slices slicesFunc, f *faults) (*tcpListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &tcpListener{ln: ln, slices: slices, faults: f, conns: map[net.Conn]struct{}{}}
	l.target.Store(&t)
	go l.acceptLoop()
	return l, nil
}

func (l *tcpListener) setTarget(t target) { l.target.Store(&t) }

func (l *tcpListener) acceptLoop() {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go l.forward(conn.(*net.TCPConn))
	}
}

// forward proxies one connection to a random eligible endpoint. With none,
// or when the endpoint refuses, the client gets a reset: kube-proxy rejects
// connections to a Service without endpoints.
func (l *tcpListener) forward(client *net.TCPConn) {
	t := l.target.Load()
	dead, killed := l.faults.accepted(t.node)
	if dead {
		l.track(client)
		defer l.untrack(client)
		blackhole(client)
		return
	}
	eps := endpointsFor(l.slices(t.namespace, t.service), t.portName, t.protocol, t.node, t.local)
	if len(eps) == 0 {
		reset(client)
		return
	}
	upstream, err := net.DialTimeout("tcp", eps[rand.IntN(len(eps))], dialTimeout)
	if err != nil {
		reset(client)
		return
	}
	l.track(client, upstream)
	defer l.untrack(client, upstream)
	done := make(chan struct{})
	go func() {
		proxyCopy(upstream.(*net.TCPConn), client)
		close(done)
	}()
	go func() {
		select {
		case <-killed: // the node vanished: its connections go with it
			_ = client.Close()
			_ = upstream.Close()
		case <-done:
		}
	}()
	proxyCopy(client, upstream.(*net.TCPConn))
	<-done
}

// proxyCopy copies src to dst and then half-closes dst, so a client's
// shutdown of its write side reaches the far end. Both are *net.TCPConn so
// the kernel's splice path is used.
func proxyCopy(dst, src *net.TCPConn) {
	_, _ = io.Copy(dst, src)
	_ = dst.CloseWrite()
}

// reset closes c with a RST rather than a FIN.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

func (l *tcpListener) track(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		l.conns[c] = struct{}{}
	}
}

func (l *tcpListener) untrack(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		delete(l.conns, c)
		_ = c.Close()
	}
}

// close stops accepting and ends the forwarded connections, as removing a
// node port does.
func (l *tcpListener) close() {
	_ = l.ln.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}

// udpListener forwards a node port's UDP flows (by client address) to
// endpoints, each flow pinned to one endpoint until it is idle.
type udpListener struct {
	pc     net.PacketConn
	target atomic.Pointer[target]
	slices slicesFunc
	faults *faults

	mu    sync.Mutex
	flows map[string]*net.UDPConn
}

func listenUDP(addr string, t target, slices slicesFunc, f *faults) (*udpListener, error) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	l := &udpListener{pc: pc, slices: slices, faults: f, flows: map[string]*net.UDPConn{}}
	l.target.Store(&t)
	go l.readLoop()
	return l, nil
}

func (l *udpListener) setTarget(t target) { l.target.Store(&t) }

func (l *udpListener) readLoop() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := l.pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if l.faults.isDead(l.target.Load().node) {
			continue
		}
		flow := l.flow(from)
		if flow == nil {
			continue // no endpoint: dropped, as kube-proxy does for UDP
		}
		_, _ = flow.Write(buf[:n])
	}
}

// flow returns the upstream socket of a client, dialing a new one if needed.
func (l *udpListener) flow(client net.Addr) *net.UDPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if up, ok := l.flows[client.String()]; ok {
		return up
	}
	t := l.target.Load()
	eps := endpointsFor(l.slices(t.namespace, t.service), t.portName, t.protocol, t.node, t.local)
	if len(eps) == 0 {
		return nil
	}
	raddr, err := net.ResolveUDPAddr("udp", eps[rand.IntN(len(eps))])
	if err != nil {
		return nil
	}
	up, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil
	}
	if l.flows == nil { // closed
		_ = up.Close()
		return nil
	}
	l.flows[client.String()] = up
	go l.replies(client, up)
	return up
}

// replies sends the endpoint's answers back to the client until the flow is
// idle for udpIdleTimeout.
func (l *udpListener) replies(client net.Addr, up *net.UDPConn) {
	defer func() {
		l.mu.Lock()
		if l.flows != nil && l.flows[client.String()] == up {
			delete(l.flows, client.String())
		}
		l.mu.Unlock()
		_ = up.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		_ = up.SetReadDeadline(time.Now().Add(udpIdleTimeout))
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		if _, err := l.pc.WriteTo(buf[:n], client); err != nil {
			return
		}
	}
}

func (l *udpListener) close() {
	_ = l.pc.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, up := range l.flows {
		_ = up.Close()
	}
	l.flows = nil
}

// healthListener serves a healthCheckNodePort as kube-proxy does.
type healthListener struct {
	srv    *http.Server
	target atomic.Pointer[target]
}

// healthAnswer is kube-proxy's health check body.
type healthAnswer struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// serveHealth serves answer on addr; answer reads the listener's current
// target, so retargeting needs no rebinding.
func serveHealth(addr string, t target, f *faults, answer func(w http.ResponseWriter, t *target)) (*healthListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &healthListener{}
	l.target.Store(&t)
	l.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.isDead(l.target.Load().node) {
			<-r.Context().Done() // a vanished node never answers
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		answer(w, l.target.Load())
	})}
	go func() { _ = l.srv.Serve(ln) }()
	return l, nil
}

// listenHealth serves a Local Service's healthCheckNodePort.
func listenHealth(addr string, t target, slices slicesFunc, f *faults) (*healthListener, error) {
	return serveHealth(addr, t, f, func(w http.ResponseWriter, t *target) {
		var a healthAnswer
		a.Service.Namespace, a.Service.Name = t.namespace, t.service
		a.LocalEndpoints = readyLocalEndpoints(slices(t.namespace, t.service), t.node)
		a.ServiceProxyHealthy = true
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(a.LocalEndpoints))
		if a.LocalEndpoints == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(a)
	})
}

func (l *healthListener) setTarget(t target) { l.target.Store(&t) }

func (l *healthListener) close() { _ = l.srv.Close() }

// listenNodeHealth serves kube-proxy's node /healthz: 200 while the node is
// healthy, 503 once it is being deleted or tainted for deletion.
func listenNodeHealth(addr string, t target, healthy func(node string) bool, f *faults) (*healthListener, error) {
	return serveHealth(addr, t, f, func(w http.ResponseWriter, t *target) {
		now := time.Now().UTC().Format(time.RFC3339Nano)
		eligible := healthy(t.node)
		if !eligible {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"lastUpdated": now, "currentTime": now, "nodeEligible": eligible})
	})
}
