package main

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// minimalNATSource is the minimal eBPF NAT's program (see its comment).
//
//go:embed bpf/minimal_nat.c
var minimalNATSource []byte

// bpfEndpoint is the program's struct endpoint: address and port in
// network byte order, as they sit in the packet.
type bpfEndpoint struct {
	Addr uint32
	Port uint16
	Pad  uint16
}

func bpfEndpointOf(ap netip.AddrPort) bpfEndpoint {
	a := ap.Addr().As4()
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], ap.Port())
	return bpfEndpoint{Addr: binary.NativeEndian.Uint32(a[:]), Port: binary.NativeEndian.Uint16(p[:])}
}

// compileMinimalNAT builds the program with clang into dir and returns the
// object's path.
func compileMinimalNAT(dir string) (string, error) {
	src := filepath.Join(dir, "minimal_nat.c")
	obj := filepath.Join(dir, "minimal_nat.o")
	if err := os.WriteFile(src, minimalNATSource, 0o644); err != nil {
		return "", err
	}
	// linux/types.h includes asm/types.h, which Debian keeps under the
	// architecture's include directory.
	cmd := exec.Command("clang", "-O2", "-g", "-target", "bpf", "-I/usr/include/x86_64-linux-gnu", "-c", src, "-o", obj)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("compiling the minimal eBPF NAT (apt-get install clang): %w: %s", err, out)
	}
	return obj, nil
}

// serveMinimalNAT loads the program, gives it the frontend and backends,
// attaches it to dev (ingress and egress) and holds it there until
// SIGTERM. It runs in the load balancer's host, as this binary started by
// startMinimalEBPF; the attachments go with the process.
func serveMinimalNAT(obj, dev, frontend string, backends []string) error {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return fmt.Errorf("reading %s: %w", obj, err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return fmt.Errorf("loading the minimal eBPF NAT: %w", err)
	}
	defer coll.Close()
	fe, err := netip.ParseAddrPort(frontend)
	if err != nil {
		return err
	}
	if err := coll.Maps["config"].Put(uint32(0), bpfEndpointOf(fe)); err != nil {
		return fmt.Errorf("setting the frontend: %w", err)
	}
	for i, b := range backends {
		ap, err := netip.ParseAddrPort(b)
		if err != nil {
			return err
		}
		if err := coll.Maps["config"].Put(uint32(i+1), bpfEndpointOf(ap)); err != nil {
			return fmt.Errorf("setting backend %s: %w", b, err)
		}
	}
	if err := coll.Maps["count"].Put(uint32(0), uint32(len(backends))); err != nil {
		return fmt.Errorf("setting the backend count: %w", err)
	}
	iface, err := net.InterfaceByName(dev)
	if err != nil {
		return err
	}
	for _, a := range []struct {
		prog   string
		attach ebpf.AttachType
	}{
		{"to_backend", ebpf.AttachTCXIngress},
		{"to_client", ebpf.AttachTCXEgress},
	} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: coll.Programs[a.prog], Attach: a.attach})
		if err != nil {
			return fmt.Errorf("attaching %s to %s: %w", a.prog, dev, err)
		}
		defer l.Close()
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	return nil
}

// startMinimalEBPF runs this binary as the minimal eBPF NAT on the load
// balancer's host (routed topology only: it translates on the
// client-side interface, and counts on the backends' replies coming back
// through that host).
func startMinimalEBPF(t *topology, dir, frontend string, backends []string) (*lbProcess, error) {
	if t.lb == nil {
		return nil, errors.New("the minimal eBPF NAT runs in the routed topology only")
	}
	obj, err := compileMinimalNAT(dir)
	if err != nil {
		return nil, err
	}
	return startSelf(t, dir, "minimal-ebpf", frontend, "-serve-minimal-ebpf", obj, "-frontend", frontend, "-backends", strings.Join(backends, ","))
}
