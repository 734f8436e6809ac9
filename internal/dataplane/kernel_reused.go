package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A client may open a connection from the port of an earlier one whose
// end this host never saw (its last segments went through another LB
// host, or were lost): conntrack still holds the old flow as established,
// and it ignores a SYN there, which then goes to the old flow's backend,
// translated as before. When that backend refuses it (the node port of a
// deleted Service whose address a new one took, a removed node), the
// client's connection is refused; when it answers, the connection goes to
// a backend that may no longer take new ones.
//
// The nftables path cannot delete a conntrack entry itself. So a rule
// just after conntrack drops such a SYN and logs it (nflog); ebb lb reads
// it and deletes the stale entry, and the client's retransmitted SYN (1 s
// later) opens a new flow, which the pick rule sends to an eligible
// backend. (The eBPF path tells a reused port by its initial sequence
// number and serves it at once: kernel_ebpf.go.)

// reusedPortGroup is the nflog group the reused-port rule logs to.
const reusedPortGroup = 0xeb

// reusedPortSnaplen is how much of a logged SYN reaches ebb lb: its IP
// header (IPv6's 40 bytes, IPv4's up to 60) and its ports.
const reusedPortSnaplen = 64

// addReusedPortChains adds the chains that drop and log a SYN which found
// an established flow of ebb's (flowLabelMarker): in prerouting (clients
// of other hosts) and output (clients on this host), after conntrack and
// before the NAT chains.
func (r *kernelRuleset) addReusedPortChains() {
	c := r.conn
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting-reused", nftables.ChainHookPrerouting}, {"output-reused", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: r.table, Type: nftables.ChainTypeFilter, Hooknum: hook.hook, Priority: nftables.ChainPriorityMangle})
		c.AddRule(&nftables.Rule{Table: r.table, Chain: ch, Exprs: reusedPortExprs()})
	}
}

// reusedPortExprs match a TCP segment with SYN alone set (a client's
// opening; every later segment of a connection has ACK set), in the
// original direction of an established flow ebb labelled.
func reusedPortExprs() []expr.Any {
	const synAckFinRst = 0x02 | 0x10 | 0x01 | 0x04
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{synAckFinRst}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}},
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(expr.CtStateBitESTABLISHED), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
		&expr.Ct{Key: expr.CtKeyLABELS, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{flowLabelMarker}},
		&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD, Group: reusedPortGroup, Snaplen: reusedPortSnaplen, QThreshold: 1},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// reusedPorts reads the SYNs the reused-port rule logs and deletes the
// stale conntrack entries they found. One process in a network namespace
// can hold the nflog group: during a hand-off the old ebb lb holds it
// until it exits, and the new one binds it then.
type reusedPorts struct {
	netns int
	log   logr.Logger
	retry time.Duration

	// probed and nflog say whether the kernel was asked, and takes rules
	// that log to nflog (probeNflog); only sync, under the engine's lock,
	// reads and writes them.
	probed, nflog bool

	mu      sync.Mutex
	stop    chan struct{}
	done    chan struct{}
	conn    *netlink.Conn // the nflog socket, while bound
	deleted func()        // counts a deleted entry
}

// supported reports whether the kernel takes the reused-port chains, asking
// it the first time. A kernel without nflog (nfnetlink_log) refuses a rule
// that logs to a group, and with it the whole table: the engine then
// works without the chains, and says so once.
func (p *reusedPorts) supported() bool {
	if !p.probed {
		p.probed = true
		err := probeNflog(p.netns)
		p.nflog = err == nil
		if err != nil {
			p.log.Error(err, "The kernel takes no nftables rule that logs to nflog; a client port used again after a connection whose end this host never saw is sent where the old connection went (load nfnetlink_log, and restart ebb lb)")
		}
	}
	return p.nflog
}

// probeNflog adds a table with the reused-port rule and deletes it in the
// same transaction: the kernel checks the rule and keeps nothing. (On a
// connection of its own: the engine's outlives a failed transaction.)
func probeNflog(netns int) error {
	var opts []nftables.ConnOption
	if netns != 0 {
		opts = append(opts, nftables.WithNetNSFd(netns))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Name: "ebb-probe-nflog", Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: reusedPortExprs()})
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("probing for nflog: %w", err)
	}
	return nil
}

// start runs the reader until close, if it is not running.
func (p *reusedPorts) start(deleted func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		return
	}
	p.stop, p.done, p.deleted = make(chan struct{}), make(chan struct{}), deleted
	go p.run(p.stop, p.done)
}

// close stops the reader and lets go of the group.
func (p *reusedPorts) close() {
	// stop closes under mu, so that serve, which checks it under mu
	// before it keeps a socket, never keeps one after this.
	p.mu.Lock()
	stop, done := p.stop, p.done
	p.stop, p.done = nil, nil
	if stop != nil {
		close(stop)
	}
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (p *reusedPorts) run(stop, done chan struct{}) {
	defer close(done)
	var lastErr string
	for {
		err := p.serve(stop, lastErr != "")
		select {
		case <-stop:
			return
		default:
		}
		// Held by another process (the ebb lb this one takes over from),
		// or nflog is missing: the rule drops a reused port's SYNs still,
		// and the client's retransmissions are served once a reader binds.
		switch {
		case err == nil || err.Error() == lastErr:
		case errors.Is(err, unix.EPERM):
			// nflog answers EPERM to a socket binding a group another
			// socket holds (this process has CAP_NET_ADMIN, or it could
			// not have installed the tables).
			p.log.Info("Another process reads the SYNs of reused client ports (the ebb lb this one takes over from, most likely); reading them once it exits", "group", reusedPortGroup)
		default:
			p.log.Error(err, "Reading the SYNs of reused client ports (nftables path); retrying", "group", reusedPortGroup)
		}
		if err != nil {
			lastErr = err.Error()
		}
		select {
		case <-stop:
			return
		case <-time.After(p.retry):
		}
	}
}

// serve binds the group and deletes the entries of the SYNs it reads,
// until its socket fails or is closed; waited says an earlier try failed.
func (p *reusedPorts) serve(stop chan struct{}, waited bool) error {
	c, err := bindNflog(p.netns, reusedPortGroup)
	if err != nil {
		return err
	}
	if waited {
		p.log.Info("Reading the SYNs of reused client ports now", "group", reusedPortGroup)
	}
	p.mu.Lock()
	select {
	case <-stop:
		p.mu.Unlock()
		_ = c.Close()
		return nil
	default:
	}
	p.conn = c
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.conn = nil
		p.mu.Unlock()
		_ = c.Close()
	}()
	ct, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: p.netns})
	if err != nil {
		return fmt.Errorf("opening a conntrack socket: %w", err)
	}
	defer ct.Close()
	for {
		msgs, err := c.Receive()
		if err != nil {
			return fmt.Errorf("reading nflog group %d: %w", reusedPortGroup, err)
		}
		for _, m := range msgs {
			t, ok := reusedTupleOf(m)
			if !ok {
				continue
			}
			if err := deleteConntrack(ct, t); err != nil {
				if !errors.Is(err, unix.ENOENT) {
					p.log.Error(err, "Deleting the stale flow of a reused client port", "client", t.src.String(), "frontend", t.dst.String())
				}
				continue
			}
			p.log.V(1).Info("A client reused the port of a flow this host never saw end; deleted it", "client", t.src.String(), "frontend", t.dst.String())
			p.deleted()
		}
	}
}

// nflog's netlink constants (linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG     = 4
	nfulnlMsgPacket    = 0
	nfulnlMsgConfig    = 1
	nfulaPayload       = 9
	nfulaCfgCmd        = 1
	nfulaCfgMode       = 2
	nfulaCfgQThresh    = 5
	nfulnlCfgCmdBind   = 1
	nfulnlCopyPacket   = 2
	nfnlSubsysCTNetlnk = 1
	ipctnlMsgCtDelete  = 2
	ctaTupleOrig       = 1
	ctaTupleIP         = 1
	ctaTupleProto      = 2
	ctaIPv4Src         = 1
	ctaIPv4Dst         = 2
	ctaIPv6Src         = 3
	ctaIPv6Dst         = 4
	ctaProtoNum        = 1
	ctaProtoSrcPort    = 2
	ctaProtoDstPort    = 3
)

// nfgenmsg is netfilter's message header: family, version 0, resource id
// (for nflog, the group).
func nfgenmsg(family uint8, resID uint16) []byte {
	b := []byte{family, 0, 0, 0}
	binary.BigEndian.PutUint16(b[2:], resID)
	return b
}

// bindNflog opens a netfilter socket in netns bound to an nflog group, to
// be sent each packet's headers at once (no batching).
func bindNflog(netns int, group uint16) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("opening an nflog socket: %w", err)
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, reusedPortSnaplen)
	mode[4] = nfulnlCopyPacket
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	for _, a := range [][]netlink.Attribute{
		{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}},
		{{Type: nfulaCfgMode, Data: mode}, {Type: nfulaCfgQThresh, Data: qthresh}},
	} {
		attrs, err := netlink.MarshalAttributes(a)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(nfgenmsg(unix.AF_UNSPEC, group), attrs...),
		})
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("binding nflog group %d: %w", group, err)
		}
	}
	return c, nil
}

// reusedTuple is a logged SYN's client and frontend.
type reusedTuple struct {
	src, dst netip.AddrPort
}

// reusedTupleOf reads the client's and the frontend's address and port
// from a logged TCP segment.
func reusedTupleOf(m netlink.Message) (reusedTuple, bool) {
	if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return reusedTuple{}, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return reusedTuple{}, false
	}
	for ad.Next() {
		if ad.Type() == nfulaPayload {
			return parseTCPTuple(ad.Bytes())
		}
	}
	return reusedTuple{}, false
}

// parseTCPTuple reads the addresses and ports of an IPv4 or IPv6 packet
// that carries TCP right after its IP header (as the rule's SYNs do).
func parseTCPTuple(p []byte) (reusedTuple, bool) {
	if len(p) < 1 {
		return reusedTuple{}, false
	}
	var src, dst netip.Addr
	var l4 []byte
	switch p[0] >> 4 {
	case 4:
		ihl := int(p[0]&0x0f) * 4
		if ihl < 20 || len(p) < ihl+4 || p[9] != unix.IPPROTO_TCP {
			return reusedTuple{}, false
		}
		src, dst, l4 = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), p[ihl:]
	case 6:
		if len(p) < 44 || p[6] != unix.IPPROTO_TCP {
			return reusedTuple{}, false
		}
		src, dst, l4 = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])), p[40:]
	default:
		return reusedTuple{}, false
	}
	return reusedTuple{
		src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:2])),
		dst: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:4])),
	}, true
}

// deleteConntrack deletes the TCP conntrack entry whose original
// direction is t.
func deleteConntrack(c *netlink.Conn, t reusedTuple) error {
	family, srcType, dstType := uint8(unix.AF_INET), uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if t.src.Addr().Is6() {
		family, srcType, dstType = unix.AF_INET6, ctaIPv6Src, ctaIPv6Dst
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleOrig, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(ctaTupleIP, func(ae *netlink.AttributeEncoder) error {
			ae.Bytes(srcType, t.src.Addr().AsSlice())
			ae.Bytes(dstType, t.dst.Addr().AsSlice())
			return nil
		})
		ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
			ae.Uint8(ctaProtoNum, unix.IPPROTO_TCP)
			ae.Bytes(ctaProtoSrcPort, binary.BigEndian.AppendUint16(nil, t.src.Port()))
			ae.Bytes(ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, t.dst.Port()))
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysCTNetlnk<<8 | ipctnlMsgCtDelete), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenmsg(family, 0), attrs...),
	})
	if err != nil {
		return fmt.Errorf("deleting the conntrack entry of %s to %s: %w", t.src, t.dst, err)
	}
	return nil
}
