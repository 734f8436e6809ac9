package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Offer is the predecessor's side: it offers the sockets to whichever
// successor asks.
type Offer struct {
	address string
	ln      *net.UnixListener
	log     logr.Logger
	// taking: a successor has asked and not yet served or given up.
	taking atomic.Bool
	// servingTimeout is servingTimeout (shorter in tests).
	servingTimeout time.Duration
}

// Taking reports whether a successor is taking over now: it has asked
// for the sockets and not yet served on them or gone away. A process told
// to stop meanwhile does better to let it finish than to stop first.
func (o *Offer) Taking() bool { return o.taking.Load() }

// Listen starts offering at address. A path left behind by a process that
// is gone is replaced; one that a live process listens on is an error.
func Listen(log logr.Logger, address string) (*Offer, error) {
	if !abstract(address) {
		if c, err := net.DialUnix(network, nil, unixAddr(address)); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("another process offers its sockets at %s", address)
		}
		if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing the stale hand-off socket %s: %w", address, err)
		}
	}
	ln, err := net.ListenUnix(network, unixAddr(address))
	if err != nil {
		return nil, fmt.Errorf("listening for a successor on %s: %w", address, err)
	}
	// The file is removed by Close, not when the listener closes (a
	// successor listens on the same path by then).
	ln.SetUnlinkOnClose(false)
	return &Offer{address: address, ln: ln, log: log, servingTimeout: servingTimeout}, nil
}

// Close stops offering: a successor that comes now opens its own sockets.
func (o *Offer) Close() {
	_ = o.ln.Close()
}

// Successor is a process that serves on the sockets handed to it.
type Successor struct {
	c   *net.UnixConn
	PID int
}

// Release tells the successor that this process accepts no more
// connections: the successor now serves alone.
func (s *Successor) Release() error {
	defer s.c.Close()
	_ = s.c.SetWriteDeadline(time.Now().Add(exchangeTimeout))
	return send(s.c, message{Op: opReleased, PID: os.Getpid()}, nil)
}

// Serve hands the sockets that sockets returns (the caller's to close
// afterwards) to each successor that asks, until one of them serves on
// them: it returns that successor, and stops offering. A successor that
// fails or goes away first changes nothing. It returns ctx's error when ctx
// is done first.
func (o *Offer) Serve(ctx context.Context, sockets func() ([]*os.File, error)) (*Successor, error) {
	stop := context.AfterFunc(ctx, o.Close)
	defer stop()
	for {
		c, err := o.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("waiting for a successor on %s: %w", o.address, err)
		}
		o.taking.Store(true)
		s, err := o.handOver(ctx, c, sockets)
		o.taking.Store(false)
		if err != nil {
			_ = c.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, errProbed) {
				continue
			}
			o.log.Error(err, "A successor did not take over; serving on", "address", o.address)
			continue
		}
		o.Close()
		return s, nil
	}
}

// handOver runs the exchange with one successor, up to its serving.
func (o *Offer) handOver(ctx context.Context, c *net.UnixConn, sockets func() ([]*os.File, error)) (*Successor, error) {
	if err := sameUser(c); err != nil {
		return nil, fmt.Errorf("refusing a successor: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	m, _, err := receive(c, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the successor's request: %w", err)
	}
	if m.Op == opProbe {
		if err := send(c, message{Op: opHere, Version: protocolVersion, PID: os.Getpid()}, nil); err != nil {
			return nil, err
		}
		return nil, errProbed
	}
	if m.Op != opTake || m.Version != protocolVersion {
		return nil, fmt.Errorf("the successor (pid %d) asked %q in version %d; this process speaks version %d", m.PID, m.Op, m.Version, protocolVersion)
	}
	files, err := sockets()
	if err != nil {
		return nil, fmt.Errorf("duplicating the sockets: %w", err)
	}
	defer closeAll(files)
	if err := send(c, message{Op: opSockets, Version: protocolVersion, PID: os.Getpid(), Sockets: len(files)}, nil); err != nil {
		return nil, err
	}
	for rest := files; len(rest) > 0; {
		batch := rest[:min(len(rest), maxBatch)]
		rest = rest[len(batch):]
		if err := send(c, message{Op: opBatch, Sockets: len(batch)}, batch); err != nil {
			return nil, err
		}
	}
	o.log.Info("Handed the sockets to a successor; waiting for it to serve", "successor", m.PID, "sockets", len(files))
	// The successor serves once it has its configuration (a cache sync
	// for the cluster's Services): a generous deadline, so that one that
	// never answers does not hold every later successor off.
	_ = c.SetDeadline(time.Now().Add(o.servingTimeout))
	done, _, err := receive(c, 0)
	if err != nil {
		return nil, fmt.Errorf("waiting for successor %d to serve: %w", m.PID, err)
	}
	if done.Op != opServing {
		return nil, fmt.Errorf("successor %d said %q instead of %q", m.PID, done.Op, opServing)
	}
	return &Successor{c: c, PID: m.PID}, nil
}
