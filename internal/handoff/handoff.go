// Package handoff passes a process's listening sockets to its successor on
// the same host, so that a restart or an upgrade of a server loses no
// connection: the sockets themselves move (SCM_RIGHTS over a Unix socket,
// as HAProxy's `expose-fd listeners` does), so the kernel's accept queues
// and the addresses stay as they are, and no new connection is refused
// while two processes share them.
//
// The exchange, on a SOCK_SEQPACKET Unix socket the running process (the
// predecessor) listens on:
//
//	successor   -> predecessor  take
//	predecessor -> successor    sockets (count), then the descriptors in batches
//	successor   -> predecessor  serving (once it serves on them)
//	predecessor -> successor    released (it accepts no more; the successor
//	                            may take over what only one may do, e.g. BGP)
//
// Until serving, nothing changes for the predecessor: a successor that
// fails or goes away before it serves leaves the predecessor serving as if
// it had never come, ready for the next one.
//
// The address is a path, or a name in the abstract namespace when it
// starts with "@" (Linux): an abstract name belongs to the network
// namespace, which is exactly the scope of the sockets handed over (two
// pods in one host network find each other; two hosts never do).
package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// protocolVersion is the exchange's version: a successor refuses a
// predecessor of another version (it then opens its own sockets).
const protocolVersion = 1

// maxBatch is how many descriptors go in one message (Linux allows 253).
const maxBatch = 200

// message is every message of the exchange.
type message struct {
	Op      string `json:"op"`
	Version int    `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	// Sockets is the number of descriptors that follow (op "sockets"),
	// or in this batch (op "batch").
	Sockets int `json:"sockets,omitempty"`
}

const (
	opTake     = "take"
	opSockets  = "sockets"
	opBatch    = "batch"
	opServing  = "serving"
	opReleased = "released"
	// A probe (Probe) asks only who offers; the answer is here, with the
	// offering process's PID, and nothing is handed over.
	opProbe = "probe"
	opHere  = "here"
)

// network is a sequenced-packet Unix socket: message boundaries are kept,
// so each batch arrives with its descriptors.
const network = "unixpacket"

func unixAddr(address string) *net.UnixAddr {
	return &net.UnixAddr{Net: network, Name: address}
}

// abstract reports whether an address names the abstract namespace, where
// there is no file to clean up.
func abstract(address string) bool { return strings.HasPrefix(address, "@") }

func send(c *net.UnixConn, m message, files []*os.File) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(data, oob, nil); err != nil {
		return fmt.Errorf("sending %s: %w", m.Op, err)
	}
	return nil
}

// receive reads one message and the descriptors it carries (at most
// maxFiles).
func receive(c *net.UnixConn, maxFiles int) (message, []*os.File, error) {
	buf := make([]byte, 4096)
	var oob []byte
	if maxFiles > 0 {
		oob = make([]byte, unix.CmsgSpace(maxFiles*4))
	}
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return message{}, nil, err
	}
	files, ferr := filesFrom(oob[:oobn])
	if ferr == nil && flags&unix.MSG_CTRUNC != 0 {
		ferr = errors.New("descriptors were truncated")
	}
	if n == 0 && ferr == nil {
		ferr = errors.New("the peer closed the connection")
	}
	var m message
	if ferr == nil {
		ferr = json.Unmarshal(buf[:n], &m)
	}
	if ferr != nil {
		closeAll(files)
		return message{}, nil, ferr
	}
	return m, files, nil
}

func filesFrom(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parsing the control message: %w", err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "handed-over-socket"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// sameUser checks that the peer of c runs as this process's user: the
// sockets of a server go to nobody else (an abstract address has no file
// permissions to keep others out).
func sameUser(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("reading the peer's credentials: %w", cerr)
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("process %d runs as user %d, not %d", cred.Pid, cred.Uid, os.Geteuid())
	}
	return nil
}

// noPredecessor reports whether a dial error means nobody listens.
func noPredecessor(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// exchangeTimeout bounds each step of the exchange but the wait for
// serving, so that a stuck peer cannot hold the other for ever.
const exchangeTimeout = 10 * time.Second

// servingTimeout bounds the wait for a successor to serve (it reads its
// whole configuration first): the predecessor then serves on and offers
// to the next one.
const servingTimeout = 5 * time.Minute
