package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// errProbed ends an exchange that only asked who offers (Probe): not a
// failed hand-off.
var errProbed = errors.New("probed")

// Probe asks whether another process offers its sockets at address, that
// is, serves on this host now, and returns its PID (0 when nobody offers).
// A process that stops without having handed over uses it to tell whether
// what it shares with such a process on the host (the addresses' local
// routes, kernel rules) must stay.
func Probe(ctx context.Context, address string) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		if noPredecessor(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("asking who offers at %s: %w", address, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	if err := sameUser(c); err != nil {
		return 0, fmt.Errorf("asking who offers at %s: %w", address, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	if err := send(c, message{Op: opProbe, Version: protocolVersion, PID: os.Getpid()}, nil); err != nil {
		return 0, err
	}
	m, _, err := receive(c, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the answer of the process at %s: %w", address, err)
	}
	if m.Op != opHere || m.PID == 0 {
		return 0, fmt.Errorf("the process at %s answered %q to a probe", address, m.Op)
	}
	return m.PID, nil
}
