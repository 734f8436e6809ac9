// Package engine_test runs `ebb lb` as a user runs it standalone, with
// each engine, on a small network of namespaces the test makes: a client
// host routed through the load balancer's host to a backend host.
package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

const frontend = "10.9.0.1:80"

// testNet is the client, the load balancer's host and the backend host.
type testNet struct {
	client, lb, backend *network.Host
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	n := &testNet{}
	for _, h := range []struct {
		name string
		to   **network.Host
	}{{"client", &n.client}, {"lb", &n.lb}, {"backend", &n.backend}} {
		host, err := network.NewHost(h.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(host.Close)
		*h.to = host
	}
	pfx := netip.MustParsePrefix
	for _, err := range []error{
		network.LinkHosts(n.lb, "to-client", []netip.Prefix{pfx("10.2.0.1/24")}, n.client, "eth0", []netip.Prefix{pfx("10.2.0.2/24")}),
		network.LinkHosts(n.lb, "to-backend", []netip.Prefix{pfx("10.1.0.1/24")}, n.backend, "eth0", []netip.Prefix{pfx("10.1.0.2/24")}),
		n.client.AddRoute(pfx("10.9.0.0/24"), netip.MustParseAddr("10.2.0.1")),
		n.lb.SetSysctl("net/ipv4/ip_forward", "1"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// echo serves an echo on the backend host and counts its connections.
func (n *testNet) echo(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	ln, err := n.backend.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return &accepted
}

// ebbLB starts `ebb lb` on the load balancer's host with the config and
// engine, and any more flags.
func (n *testNet) ebbLB(t *testing.T, config, engine string, flags ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		t.Fatal("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	file := filepath.Join(t.TempDir(), "lb.yaml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"lb", "--config", file, "--engine", engine, "--metrics-bind-address", ""}, flags...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.lb.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &out
}

func (n *testNet) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return n.client.DialContext(ctx, "tcp", frontend)
}

// servedConnection waits for ebb lb to serve, then opens a connection
// through it with one round trip done; it closes when the test ends.
func (n *testNet) servedConnection(t *testing.T) net.Conn {
	t.Helper()
	eventually(t, "ebb lb to serve", func() bool { return newRoundTrip(n) == nil })
	c, err := n.dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	return c
}

func roundTrip(c net.Conn, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, sent %q", buf, msg)
	}
	return nil
}

func newRoundTrip(n *testNet) error {
	c, err := n.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, "hello")
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func config(adminA string) string {
	return fmt.Sprintf(`frontends:
- name: web
  address: 10.9.0.1
  port: 80
  backends:
  - {address: 10.1.0.2, port: 8080, owner: node-a, adminState: %s}
  - {address: 10.1.0.2, port: 8081, owner: node-b}
`, adminA)
}

// With the kernel engine, on either of its paths, `ebb lb` forwards
// through the kernel: a connection established through it survives the
// process stopping (SIGTERM) and a new process taking over, new
// connections keep being served while no process runs, and the new
// process's admin Down takes the backend out for new connections while
// the established one continues.
func TestKernelEngineSurvivesARestart(t *testing.T) {
	t.Run("nftables", func(t *testing.T) { kernelEngineSurvivesARestart(t) })
	t.Run("ebpf", func(t *testing.T) {
		// The eBPF path's pins outlive ebb lb, by design: this test's
		// own directory, removed (which detaches the program) at the end.
		pins := fmt.Sprintf("/sys/fs/bpf/ebb-e2e-%d", os.Getpid())
		t.Cleanup(func() {
			if err := os.RemoveAll(pins); err != nil {
				t.Error(err)
			}
		})
		kernelEngineSurvivesARestart(t, "--kernel-path", "ebpf", "--bpf-pin-dir", pins)
	})
}

func kernelEngineSurvivesARestart(t *testing.T, flags ...string) {
	n := newTestNet(t)
	a, b := n.echo(t, "10.1.0.2:8080"), n.echo(t, "10.1.0.2:8081")
	first, out := n.ebbLB(t, config("None"), "Kernel", flags...)
	long := n.servedConnection(t)
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("ebb lb exited with %v:\n%s", err, out)
	}
	if err := roundTrip(long, "while no ebb lb runs"); err != nil {
		t.Errorf("the established connection broke when ebb lb stopped: %v", err)
	}
	for i := range 4 {
		if err := newRoundTrip(n); err != nil {
			t.Errorf("new connection %d while no ebb lb runs: %v", i, err)
		}
	}

	_, out = n.ebbLB(t, config("Down"), "Kernel", flags...)
	eventually(t, "the new ebb lb to set backend a Down", func() bool {
		before := a.Load()
		for range 4 {
			if newRoundTrip(n) != nil {
				return false
			}
		}
		return a.Load() == before
	})
	before, bBefore := a.Load(), b.Load()
	for i := range 6 {
		if err := newRoundTrip(n); err != nil {
			t.Fatalf("new connection %d with a Down: %v", i, err)
		}
	}
	if a.Load() != before || b.Load() != bBefore+6 {
		t.Errorf("with a Down: a took %d, b %d of 6 new connections", a.Load()-before, b.Load()-bBefore)
	}
	if err := roundTrip(long, "after the restart"); err != nil {
		t.Errorf("the established connection broke when the new ebb lb took over: %v", err)
	}
	if strings.Contains(out.String(), "KernelFailed") {
		t.Errorf("ebb lb could not install its table:\n%s", out)
	}
}

// SIGTERM to `ebb lb` with the proxy engine: new connections are refused
// at once, an established one is served until the client closes it, and
// then the process exits cleanly.
func TestProxyEngineStopsGracefully(t *testing.T) {
	n := newTestNet(t)
	n.echo(t, "10.1.0.2:8080")
	n.echo(t, "10.1.0.2:8081")
	lb, out := n.ebbLB(t, config("None"), "Proxy")
	long := n.servedConnection(t)
	exited := make(chan error, 1)
	if err := lb.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- lb.Wait() }()
	eventually(t, "new connections to be refused", func() bool { return newRoundTrip(n) != nil })
	if err := roundTrip(long, "during the stop"); err != nil {
		t.Errorf("the established connection broke on SIGTERM: %v", err)
	}
	select {
	case err := <-exited:
		t.Fatalf("ebb lb exited (%v) with a connection still open:\n%s", err, out)
	default:
	}
	long.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("ebb lb exited with %v:\n%s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ebb lb did not exit once its last connection ended:\n%s", out)
	}
	if !strings.Contains(out.String(), "Every connection ended") {
		t.Errorf("ebb lb's log does not say its connections ended:\n%s", out)
	}
}
