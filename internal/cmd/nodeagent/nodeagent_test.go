package nodeagent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// A client that keeps a connection open after its request, sending
// nothing, is disconnected after the idle timeout (before: held forever).
func TestAnIdleConnectionIsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newServer("", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), 300*time.Millisecond)
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("reading from the idle connection: %v, want EOF (closed by the server)", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("the idle connection was closed after %s, want about the idle timeout", waited)
	}
}

// The metrics are unauthenticated: by default only this host reaches them
// (before: every address, ":9465").
func TestMetricsListenOnTheLoopbackByDefault(t *testing.T) {
	def := NewCommand().Flags().Lookup("metrics-bind-address").DefValue
	if ap, err := netip.ParseAddrPort(def); err != nil || !ap.Addr().IsLoopback() {
		t.Errorf("--metrics-bind-address defaults to %q, want a loopback address", def)
	}
}
