package dataplane

import (
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop's system calls bypass the Go runtime's system-call
// bookkeeping (RawSyscall). Every one of them is on a non-blocking socket
// or epoll descriptor and returns without sleeping, but some do tens of
// microseconds of kernel work (a connect on loopback runs the whole
// handshake inline). Through syscall.Syscall, the runtime's monitor takes
// the processor away from any call it sees spanning two of its ticks (20
// µs apart when busy) and starts another thread to look for work; the loop
// has none to give, so every such hand-off is pure cost (it was 9% of the
// loop's CPU with one processor). Raw calls look like running code to the
// runtime, and the loop yields once a millisecond (see yield).

func rawErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func sysRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func sysWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func sysClose(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	return rawErr(e)
}

func sysShutdown(fd, how int) error {
	_, _, e := unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), uintptr(how), 0)
	return rawErr(e)
}

func sysSocket(family int) (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func sysSetsockoptInt(fd, level, opt, value int) error {
	v := int32(value)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), 4, 0)
	return rawErr(e)
}

// sysConnect starts a non-blocking connect to to.
func sysConnect(fd int, to netip.AddrPort) error {
	var sa unix.RawSockaddrAny
	n := putSockaddr(&sa, to)
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(n))
	return rawErr(e)
}

// sysBind binds fd to at.
func sysBind(fd int, at netip.AddrPort) error {
	var sa unix.RawSockaddrAny
	n := putSockaddr(&sa, at)
	_, _, e := unix.RawSyscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(n))
	return rawErr(e)
}

// sysGetsockname is the local address of fd (zero for a socket that is
// not IPv4 or IPv6).
func sysGetsockname(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	if e != 0 {
		return netip.AddrPort{}, e
	}
	return addrPortOfRaw(&sa), nil
}

// socketFamily is the socket family (AF_INET, AF_INET6) of an address.
func socketFamily(ap netip.AddrPort) int {
	if ap.Addr().Unmap().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// setResetOnClose makes closing fd send a reset (SO_LINGER 0), so that a
// refused client fails fast instead of waiting.
func setResetOnClose(fd int) {
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
}

// sysAccept4 accepts a connection, non-blocking, and returns its peer.
func sysAccept4(fd int) (int, netip.AddrPort, error) {
	var sa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	nfd, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(nfd), addrPortOfRaw(&sa), nil
}

func sysEpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sysEpollWaitFor waits up to d for events (epoll_pwait2, Linux 5.11:
// epoll_wait's timeout is in milliseconds).
func sysEpollWaitFor(epfd int, events []unix.EpollEvent, d time.Duration) (int, error) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT2, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), uintptr(unsafe.Pointer(&ts)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func sysEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return rawErr(e)
}

// putSockaddr writes ap into sa as the kernel takes it and returns its
// length.
func putSockaddr(sa *unix.RawSockaddrAny, ap netip.AddrPort) int {
	a := ap.Addr().Unmap()
	port := ap.Port()
	if a.Is4() {
		s := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s.Family = unix.AF_INET
		putPort(&s.Port, port)
		s.Addr = a.As4()
		return unix.SizeofSockaddrInet4
	}
	s := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
	s.Family = unix.AF_INET6
	putPort(&s.Port, port)
	s.Addr = a.As16()
	if z := a.Zone(); z != "" {
		s.Scope_id = zoneIndex(z)
	}
	return unix.SizeofSockaddrInet6
}

// addrPortOfRaw reads an IPv4 or IPv6 socket address (zero for others).
func addrPortOfRaw(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		s := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(s.Addr), getPort(&s.Port))
	case unix.AF_INET6:
		s := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr), getPort(&s.Port))
	}
	return netip.AddrPort{}
}

// putPort and getPort write and read a port in network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

func getPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}
