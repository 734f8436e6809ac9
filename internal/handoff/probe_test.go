package handoff

import (
	"context"
	"net"
	"os"
	"testing"

	"github.com/go-logr/logr/testr"
)

// A probe names the process that offers, hands nothing over and leaves the
// offer open: a successor that comes next still takes the sockets.
func TestProbeNamesTheOfferingProcessAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	if pid, err := Probe(ctx, address(t)); pid != 0 || err != nil {
		t.Fatalf("Probe with nobody offering = %d, %v; want 0, no error", pid, err)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	successors := serveAsync(t, testr.New(t), address(t), listenerFiles(ln))
	for range 2 {
		pid, err := Probe(ctx, address(t))
		if err != nil || pid != os.Getpid() {
			t.Fatalf("Probe = %d, %v; want this process (%d)", pid, err, os.Getpid())
		}
	}
	taken, err := Take(ctx, address(t))
	if err != nil || taken == nil {
		t.Fatalf("Take after probes: %v, %v", taken, err)
	}
	defer closeAll(taken.Files)
	if len(taken.Files) != 1 {
		t.Fatalf("took %d sockets, want 1", len(taken.Files))
	}
	go func() { _ = taken.Serving(ctx) }()
	if s := <-successors; s == nil {
		t.Fatal("Serve returned no successor after the probes")
	} else {
		_ = s.Release()
	}
}
