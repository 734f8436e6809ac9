package network

import (
	"fmt"
	"os"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// openTap opens a packet socket on every interface of the root host (the
// bridge device and the hosts' ports on it among them) that passes only
// the frames prog accepts, cut to what it returns; what names the tap in
// errors.
func openTap(prog []bpf.Instruction, what string) (*os.File, error) {
	filter, err := assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assembling the filter of %s: %w", what, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("opening a packet socket for %s: %w", what, err)
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("attaching the filter of %s: %w", what, err)
	}
	// Every interface (index 0), and ETH_P_ALL: a bridge port's frames
	// reach only the taps of every protocol, before the bridge takes them.
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: 0}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("binding the packet socket of %s to every interface: %w", what, err)
	}
	return os.NewFile(uintptr(fd), what), nil
}

// assemble turns a classic BPF program into what SO_ATTACH_FILTER takes.
func assemble(prog []bpf.Instruction) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, err
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}
