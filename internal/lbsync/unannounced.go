package lbsync

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
)

// Event reasons on a Service whose address this replica serves but cannot
// announce (so clients may not reach it through this host), and once it
// can again.
const (
	ReasonAddressNotAnnounced = "AddressNotAnnounced"
	ReasonAddressAnnounced    = "AddressAnnounced"
)

// Unannouncer is what Syncer.Addresses may also be: the served addresses
// it cannot announce now, and why.
type Unannouncer interface {
	Unannounced() map[netip.Addr]string
}

// unannouncedReporter tells the Services of an address, once per change,
// that this replica cannot announce it and why, and when it can again.
// Only Run's goroutine uses it.
type unannouncedReporter struct {
	recorder events.EventRecorder
	node     string
	// reported is the reason last reported per address.
	reported map[netip.Addr]string
}

// report compares now with what was reported and publishes the changes
// on the Services with a frontend at each address (cfg, owners: the last
// apply's frontends and their Services).
func (r *unannouncedReporter) report(log logr.Logger, now map[netip.Addr]string, cfg dataplane.Config, owners map[string]*corev1.Service) {
	for _, addr := range slices.SortedFunc(maps.Keys(now), netip.Addr.Compare) {
		why := now[addr]
		if r.reported[addr] == why {
			continue
		}
		svcs := servicesAt(addr, cfg, owners)
		log.Info("Cannot announce a load-balancer address", "address", addr, "reason", why, "services", len(svcs))
		if r.recorder == nil {
			continue
		}
		for _, svc := range svcs {
			event.Publish(r.recorder, addressNotAnnounced(svc, addr, r.node, why))
		}
	}
	for addr := range r.reported {
		if _, still := now[addr]; still {
			continue
		}
		svcs := servicesAt(addr, cfg, owners)
		log.Info("Announcing a load-balancer address that could not be announced before", "address", addr)
		if r.recorder == nil {
			continue
		}
		for _, svc := range svcs {
			event.Publish(r.recorder, addressAnnounced(svc, addr, r.node))
		}
	}
	r.reported = now
}

// servicesAt lists the Services with a frontend at addr, once each, in
// name order.
func servicesAt(addr netip.Addr, cfg dataplane.Config, owners map[string]*corev1.Service) []*corev1.Service {
	seen := map[types.NamespacedName]*corev1.Service{}
	for _, f := range cfg.Frontends {
		a, err := netip.ParseAddr(f.Address)
		if err != nil || a.Unmap() != addr {
			continue
		}
		if svc := owners[f.Name]; svc != nil {
			seen[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
		}
	}
	out := make([]*corev1.Service, 0, len(seen))
	for _, svc := range seen {
		out = append(out, svc)
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return strings.Compare(klog.KObj(a).String(), klog.KObj(b).String())
	})
	return out
}

func addressNotAnnounced(svc *corev1.Service, addr netip.Addr, node, why string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonAddressNotAnnounced, Action: "Announce",
		Note: fmt.Sprintf("ebb lb on %s serves %s but cannot announce it: %s; routers may not send its traffic to this host (the other addresses are announced)", hostName(node), addr, why)}
}

func addressAnnounced(svc *corev1.Service, addr netip.Addr, node string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonAddressAnnounced, Action: "Announce",
		Note: fmt.Sprintf("ebb lb on %s announces %s again", hostName(node), addr)}
}

func hostName(node string) string {
	if node == "" {
		return "this host"
	}
	return "node " + node
}
