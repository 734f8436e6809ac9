package handoff

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"
)

// Taken is the successor's side: the sockets it was given, and the
// connection on which it says it serves.
type Taken struct {
	c *net.UnixConn
	// Files are the predecessor's sockets, now also this process's.
	Files []*os.File
	// PID is the predecessor's process ID.
	PID int
}

// Take asks the process offering at address for its sockets. It returns
// nil and no error when nobody offers there (the first process on the
// host, or a predecessor that does not hand over).
func Take(ctx context.Context, address string) (*Taken, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		if noPredecessor(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("asking the process at %s for its sockets: %w", address, err)
	}
	c := conn.(*net.UnixConn)
	t, err := take(ctx, c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("taking the sockets of the process at %s: %w", address, err)
	}
	return t, nil
}

func take(ctx context.Context, c *net.UnixConn) (*Taken, error) {
	if err := sameUser(c); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	if err := send(c, message{Op: opTake, Version: protocolVersion, PID: os.Getpid()}, nil); err != nil {
		return nil, err
	}
	head, _, err := receive(c, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if head.Op != opSockets || head.Version != protocolVersion {
		return nil, fmt.Errorf("the predecessor (pid %d) answered %q in version %d; this process speaks version %d", head.PID, head.Op, head.Version, protocolVersion)
	}
	t := &Taken{c: c, PID: head.PID}
	for len(t.Files) < head.Sockets {
		m, files, err := receive(c, maxBatch)
		if err == nil && (m.Op != opBatch || len(files) != m.Sockets || len(t.Files)+len(files) > head.Sockets) {
			closeAll(files)
			err = fmt.Errorf("a batch said %q with %d sockets and carried %d", m.Op, m.Sockets, len(files))
		}
		if err != nil {
			closeAll(t.Files)
			return nil, fmt.Errorf("receiving the sockets (%d of %d): %w", len(t.Files), head.Sockets, err)
		}
		t.Files = append(t.Files, files...)
	}
	_ = c.SetDeadline(time.Time{})
	return t, nil
}

// Serving tells the predecessor that this process serves on the sockets,
// and waits (bounded by ctx) until the predecessor has stopped accepting
// and released what only one process may hold.
func (t *Taken) Serving(ctx context.Context) error {
	defer t.c.Close()
	stop := context.AfterFunc(ctx, func() { _ = t.c.Close() })
	defer stop()
	_ = t.c.SetDeadline(time.Now().Add(exchangeTimeout))
	if err := send(t.c, message{Op: opServing, PID: os.Getpid()}, nil); err != nil {
		return err
	}
	m, _, err := receive(t.c, 0)
	if err != nil {
		return fmt.Errorf("waiting for predecessor %d to release the sockets: %w", t.PID, err)
	}
	if m.Op != opReleased {
		return fmt.Errorf("predecessor %d said %q instead of %q", t.PID, m.Op, opReleased)
	}
	return nil
}

// Abort gives up the hand-off: the predecessor serves on as before.
func (t *Taken) Abort() {
	_ = t.c.Close()
}
