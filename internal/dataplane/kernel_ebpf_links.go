package dataplane

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	vnetlink "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/netnsexec"
)

// The eBPF path's attachments: both programs at tc (tcx) ingress and
// egress of each interface of the namespace but the loopback, or of the
// interfaces --bpf-interface names. Without that flag the path follows
// the namespace: an interface that appears later (a pod's veth on an LB
// host that is a node, a VLAN or bond made after ebb lb started) is
// attached when it appears, and the pins of one that goes are removed.
// Before, such an interface was never attached, and a new connection
// that came in through it (a pod on the LB host reaching the Service's
// address) found no listener and was refused.

// The pins of the attachments, by the interface's name after the prefix.
// (Ingress keeps the name it had when it was the only one, so that an
// upgrade takes its predecessor's attachments over.)
const (
	ingressPinPrefix = "link-"
	egressPinPrefix  = "egress-"
)

// pinnedInterface is the interface an attachment's pin is named after,
// or false for a pin that is not an attachment's.
func pinnedInterface(pin string) (string, bool) {
	for _, prefix := range []string{ingressPinPrefix, egressPinPrefix} {
		if name, ok := strings.CutPrefix(pin, prefix); ok {
			return name, true
		}
	}
	return "", false
}

// tcxAttachment is a program and where it goes: its pins are named
// pinPrefix and the interface's name.
type tcxAttachment struct {
	pinPrefix string
	prog      *ebpf.Program
	at        ebpf.AttachType
}

// attachedInterface is an interface the programs are attached to.
type attachedInterface struct {
	name  string
	links []link.Link
}

// attachments are the two programs of coll and where they go.
func (e *ebpfPath) attachments(coll *ebpf.Collection) []tcxAttachment {
	return []tcxAttachment{
		{ingressPinPrefix, coll.Programs["ebb_ingress"], ebpf.AttachTCXIngress},
		{egressPinPrefix, coll.Programs["ebb_egress"], ebpf.AttachTCXEgress},
	}
}

// attach attaches the programs to the interfaces, replacing the programs
// of attachments pinned by a predecessor (the kernel swaps them
// atomically: no packet goes untranslated), and pins new ones. The pins
// of interfaces that are gone are removed.
func (e *ebpfPath) attach(dir string, progs []tcxAttachment) (map[int]attachedInterface, error) {
	out := map[int]attachedInterface{}
	err := netnsexec.Run(e.netns, func() error {
		names, err := e.interfaceNames()
		if err != nil {
			return err
		}
		for _, name := range names {
			index, links, err := attachInterface(dir, name, progs)
			if err != nil {
				return err
			}
			out[index] = attachedInterface{name: name, links: links}
		}
		removeStalePins(dir, names)
		return nil
	})
	if err != nil {
		closeAttached(out)
		return nil, err
	}
	return out, nil
}

// attachInterface attaches the programs to the interface name and
// returns its index. It runs in the namespace.
func attachInterface(dir, name string, progs []tcxAttachment) (int, []link.Link, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return 0, nil, fmt.Errorf("finding interface %s: %w", name, err)
	}
	var links []link.Link
	for _, a := range progs {
		l, err := attachOne(dir, ifi.Index, name, a)
		if err != nil {
			closeLinks(links)
			return 0, nil, err
		}
		links = append(links, l)
	}
	return ifi.Index, links, nil
}

func attachOne(dir string, index int, name string, a tcxAttachment) (link.Link, error) {
	pin := filepath.Join(dir, a.pinPrefix+name)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if err := l.Update(a.prog); err == nil {
			return l, nil
		}
		// A link whose interface went away: attach afresh.
		_ = l.Unpin()
		_ = l.Close()
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: index, Program: a.prog, Attach: a.at})
	if err != nil {
		return nil, fmt.Errorf("attaching the eBPF kernel path to %s: %w", name, err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("pinning the attachment to %s: %w", name, err)
	}
	return l, nil
}

// removeStalePins removes the pins of attachments to interfaces other
// than names: they went while no ebb lb watched (the kernel detached
// them with the interface).
func removeStalePins(dir string, names []string) {
	entries, _ := os.ReadDir(dir)
	for _, ent := range entries {
		if name, ok := pinnedInterface(ent.Name()); ok && !slices.Contains(names, name) {
			_ = os.Remove(filepath.Join(dir, ent.Name()))
		}
	}
}

// interfaceNames are the interfaces to attach to: those configured, or
// every interface of the namespace but the loopback.
func (e *ebpfPath) interfaceNames() ([]string, error) {
	if len(e.interfaces) > 0 {
		return e.interfaces, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var names []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback == 0 {
			names = append(names, ifi.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// watchInterfaces follows the namespace's interfaces until stop: it
// attaches the programs to each new one and lets go of the attachments
// of each that goes.
func (e *ebpfPath) watchInterfaces(dir string, stop <-chan struct{}) {
	updates := make(chan vnetlink.LinkUpdate, 64)
	opts := vnetlink.LinkSubscribeOptions{
		// The interfaces there already, again: one that appeared between
		// the attachment and the subscription is not missed.
		ListExisting: true,
		ErrorCallback: func(err error) {
			e.log.Error(err, "Following the namespace's interfaces for the eBPF kernel path")
		},
	}
	if e.netns != 0 {
		ns := netns.NsHandle(e.netns)
		opts.Namespace = &ns
	}
	if err := vnetlink.LinkSubscribeWithOptions(updates, stop, opts); err != nil {
		e.log.Error(err, "Following the namespace's interfaces; the eBPF kernel path will not serve interfaces added from now on")
		return
	}
	for {
		select {
		case <-stop:
			return
		case u, ok := <-updates:
			if !ok {
				select {
				case <-stop:
				default:
					e.log.Info("Stopped following the namespace's interfaces (the netlink subscription ended); the eBPF kernel path will not serve interfaces added from now on")
				}
				return
			}
			e.interfaceChanged(dir, u, stop)
		}
	}
}

// interfaceChanged attaches the programs to an interface that appeared,
// re-pins those of one renamed, and lets go of those of one removed.
func (e *ebpfPath) interfaceChanged(dir string, u vnetlink.LinkUpdate, stop <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-stop:
		return // released meanwhile
	default:
	}
	attrs := u.Attrs()
	index, name := attrs.Index, attrs.Name
	had, attached := e.links[index]
	switch {
	case u.Header.Type == unix.RTM_DELLINK:
		if attached {
			unpinAttached(had)
			e.setAttached(index, nil)
			e.log.Info("An interface went; its attachments of the eBPF kernel path with it", "interface", had.name)
		}
	case attrs.Flags&net.FlagLoopback != 0 || (attached && had.name == name):
	case attached:
		// Renamed: the same attachments (made in the order of
		// attachments), pinned under the new name.
		for i, a := range e.attachments(e.coll) {
			if err := had.links[i].Pin(filepath.Join(dir, a.pinPrefix+name)); err != nil {
				e.log.Error(err, "Pinning an attachment of the eBPF kernel path under a renamed interface's name", "interface", name)
			}
		}
		had.name = name
		e.setAttached(index, &had)
	default:
		var links []link.Link
		err := netnsexec.Run(e.netns, func() (err error) {
			_, links, err = attachInterface(dir, name, e.attachments(e.coll))
			return err
		})
		if err != nil {
			// It may be gone already.
			e.log.Info("Cannot attach the eBPF kernel path to a new interface", "interface", name, "err", err.Error())
			return
		}
		e.setAttached(index, &attachedInterface{name: name, links: links})
		e.log.Info("Serving a new interface on the eBPF kernel path", "interface", name)
	}
}

// setAttached records (or with nil forgets) the attachments of an
// interface. e.mu is held.
func (e *ebpfPath) setAttached(index int, a *attachedInterface) {
	e.use.Lock()
	defer e.use.Unlock()
	if a == nil {
		delete(e.links, index)
		return
	}
	e.links[index] = *a
}

// unpinAttached lets go of an interface's attachments: unpinned and
// closed (the kernel detached them with the interface).
func unpinAttached(a attachedInterface) {
	for _, l := range a.links {
		_ = l.Unpin()
	}
	closeLinks(a.links)
}

func closeAttached(attached map[int]attachedInterface) {
	for _, a := range attached {
		closeLinks(a.links)
	}
}

func closeLinks(links []link.Link) {
	for _, l := range links {
		_ = l.Close()
	}
}
