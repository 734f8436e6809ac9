package nodeproxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// faults is what a benchmark or test can do to a simulated node's data
// path, and what it can learn from it: kill it (a preempted or frozen
// machine) and see when it last accepted a connection.
type faults struct {
	mu         sync.Mutex
	dead       map[string]bool
	lastAccept map[string]time.Time
	// killed is closed for every listener of a node when it is killed, so
	// they drop the connections they forward.
	killed map[string]chan struct{}
}

func newFaults() *faults {
	return &faults{dead: map[string]bool{}, lastAccept: map[string]time.Time{}, killed: map[string]chan struct{}{}}
}

// accepted records a new connection on node and reports whether the node
// is dead, with a channel closed when it is killed.
func (f *faults) accepted(node string) (dead bool, killed <-chan struct{}) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastAccept[node] = now
	return f.dead[node], f.killedLocked(node)
}

func (f *faults) isDead(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dead[node]
}

func (f *faults) killedLocked(node string) chan struct{} {
	ch, ok := f.killed[node]
	if !ok {
		ch = make(chan struct{})
		f.killed[node] = ch
	}
	return ch
}

// LastAccepted returns when a node last accepted a TCP connection on a
// node port (zero if never).
func (p *Proxy) LastAccepted(node string) time.Time {
	p.faults.mu.Lock()
	defer p.faults.mu.Unlock()
	return p.faults.lastAccept[node]
}

// Kill stops a node's data path as a machine that vanished would: its
// forwarded connections are dropped; new TCP connections to its node ports
// and health servers are accepted by the kernel but never answered (they
// time out), and UDP to it is dropped.
func (p *Proxy) Kill(node string) {
	p.faults.mu.Lock()
	defer p.faults.mu.Unlock()
	if p.faults.dead[node] {
		return
	}
	p.faults.dead[node] = true
	close(p.faults.killedLocked(node))
	delete(p.faults.killed, node)
}

// Revive serves a killed node's data path again.
func (p *Proxy) Revive(node string) {
	p.faults.mu.Lock()
	defer p.faults.mu.Unlock()
	delete(p.faults.dead, node)
}

// blackhole swallows a connection to a dead node until the client gives up.
func blackhole(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
	_ = c.Close()
}
