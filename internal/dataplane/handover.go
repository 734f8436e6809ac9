package dataplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A data plane's sockets can move to its successor on the same host (see
// internal/handoff): the predecessor gives duplicates of its listening
// sockets (Sockets), the successor serves on them (Options.Inherited)
// instead of opening new ones, and the predecessor then stops using them
// (HandOver) and serves only its established connections. The sockets
// themselves never close, so no connection waiting in an accept queue is
// lost and no new connection is refused while both processes run.

// Sockets returns duplicates of the listening sockets of the user-space
// frontends (TCP listeners and UDP sockets), for a successor; the caller
// closes them. Kernel-engine frontends have none: the kernel's table
// outlives the process.
func (d *DataPlane) Sockets() ([]*os.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*os.File
	for _, f := range d.frontends {
		var file *os.File
		var err error
		switch {
		case f.tcp != nil:
			file, err = f.tcp.File()
		case f.lst != nil:
			file, err = f.lst.file()
		case f.udp != nil:
			file, err = f.udp.File()
		default:
			continue
		}
		if err != nil {
			for _, o := range out {
				_ = o.Close()
			}
			return nil, fmt.Errorf("duplicating the socket of %s: %w", f.key, err)
		}
		out = append(out, file)
	}
	return out, nil
}

// HandOver stops this data plane using its sockets, which a successor now
// serves on: TCP listeners close (this process's descriptor only; the
// socket and its accept queue stay with the successor) and UDP sockets are
// no longer read, but stay open to send the replies of this process's UDP
// flows until they end. Established connections continue. Apply fails from
// now on: the successor owns the configuration.
func (d *DataPlane) HandOver() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handedOver = true
	d.owners.retire() // the kernel's tables are the successor's
	for _, f := range d.frontends {
		f.closeListener()
		if f.udp != nil {
			f.stopReading.Store(true)
			// Wakes the reader, which sees stopReading and returns.
			_ = f.udp.SetReadDeadline(time.Unix(1, 0))
		}
	}
}

// adoptInherited sorts the sockets a predecessor handed over by what they
// listen on; a descriptor that is not a listening TCP or a UDP socket is
// closed and logged.
func (d *DataPlane) adoptInherited(files []*os.File) {
	for _, file := range files {
		k, err := socketKey(file)
		if err != nil {
			d.log.Error(err, "Ignoring a socket handed over by the predecessor")
			_ = file.Close()
			continue
		}
		if old, ok := d.inherited[k]; ok {
			_ = old.Close()
		}
		d.inherited[k] = file
	}
}

// takeInherited returns a handed-over socket for k, ready to serve, or nil.
func (d *DataPlane) takeInherited(k frontendKey) any {
	file, ok := d.inherited[k]
	if !ok {
		return nil
	}
	delete(d.inherited, k)
	defer file.Close() // net dups it
	var l any
	var err error
	if k.protocol == UDP {
		var pc net.PacketConn
		if pc, err = net.FilePacketConn(file); err == nil {
			l = pc.(*net.UDPConn)
		}
	} else if d.loop != nil {
		l, err = inheritLoopListener(file)
	} else {
		var ln net.Listener
		if ln, err = net.FileListener(file); err == nil {
			l = ln.(*net.TCPListener)
		}
	}
	if err != nil {
		d.log.Error(err, "Opening a socket of its own instead of the one handed over", "frontend", k.String())
		return nil
	}
	d.m.inheritedSockets.Inc()
	return l
}

// ReleaseInherited closes the handed-over sockets that no frontend took
// (the predecessor served frontends this configuration does not have) and
// returns how many there were. Call it once the first configuration is
// applied: until then, a frontend may still want one.
func (d *DataPlane) ReleaseInherited() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.inherited)
	for k, f := range d.inherited {
		_ = f.Close()
		delete(d.inherited, k)
	}
	return n
}

// socketKey says what a socket listens on, from the kernel.
func socketKey(file *os.File) (frontendKey, error) {
	raw, err := file.SyscallConn()
	if err != nil {
		return frontendKey{}, err
	}
	var k frontendKey
	var kerr error
	err = raw.Control(func(fd uintptr) {
		k, kerr = socketKeyOf(int(fd))
	})
	if err != nil {
		return frontendKey{}, err
	}
	return k, kerr
}

func socketKeyOf(fd int) (frontendKey, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return frontendKey{}, fmt.Errorf("reading the socket type: %w", err)
	}
	ap, err := sysGetsockname(fd)
	if err != nil {
		return frontendKey{}, fmt.Errorf("reading the socket's address: %w", err)
	}
	if !ap.IsValid() {
		return frontendKey{}, errors.New("not an IP socket")
	}
	switch typ {
	case unix.SOCK_DGRAM:
		return frontendKey{addr: ap, protocol: UDP}, nil
	case unix.SOCK_STREAM:
		listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		if err != nil || listening == 0 {
			return frontendKey{}, fmt.Errorf("TCP socket %s is not listening", ap)
		}
		return frontendKey{addr: ap, protocol: TCP}, nil
	}
	return frontendKey{}, fmt.Errorf("socket %s has type %d, neither TCP nor UDP", ap, typ)
}
