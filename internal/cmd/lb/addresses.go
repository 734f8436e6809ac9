package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/announce/bgp"
	"github.com/ebbdev/ebb/internal/vipaddr"
)

// addresses returns what is told the served addresses after each apply:
// the local routes (unless --local-routes=false) and the BGP speaker (with
// --bgp-asn). With deferBGP the speaker opens no session until
// connectBGP: a predecessor on this host still holds them.
func (o *Options) addresses(ctx context.Context, log logr.Logger, reg prometheus.Registerer, deferBGP bool) (*addressSinks, error) {
	sinks := &addressSinks{}
	if o.LocalRoutes {
		t, err := vipaddr.New()
		if err != nil {
			return nil, fmt.Errorf("opening the local routing table (--local-routes=false to manage the addresses yourself): %w", err)
		}
		sinks.local = t
	} else {
		log.Info("Not adding local routes for the load balancer's addresses (--local-routes=false): configure them on this host")
	}
	if o.BGP.ASN != 0 {
		cfg := o.BGP
		cfg.DeferPeers = deferBGP
		for _, s := range o.BGPPeers {
			p, err := bgp.ParsePeer(s)
			if err != nil {
				sinks.close(log)
				return nil, err
			}
			p.HoldTime = o.BGPHoldTime
			cfg.Peers = append(cfg.Peers, p)
		}
		if len(cfg.Peers) == 0 {
			sinks.close(log)
			return nil, errors.New("--bgp-asn needs at least one --bgp-peer")
		}
		sp, err := bgp.Start(ctx, slog.New(logr.ToSlogHandler(log.WithName("bgp"))), cfg)
		if err != nil {
			sinks.close(log)
			return nil, err
		}
		if err := reg.Register(sp.Collector()); err != nil {
			sp.Stop()
			sinks.close(log)
			return nil, fmt.Errorf("registering BGP metrics: %w", err)
		}
		sinks.bgp = sp
		log.Info("Announcing by BGP", "asn", cfg.ASN, "routerID", cfg.RouterID, "peers", o.BGPPeers, "afterPredecessor", deferBGP)
	}
	return sinks, nil
}

// addressSinks makes the served addresses local to this host, then
// announces them; each part is optional. Once handed over to a successor
// (retire), it does nothing more: the routes and announcements are the
// successor's.
type addressSinks struct {
	mu      sync.Mutex
	local   *vipaddr.Table
	bgp     *bgp.Speaker
	retired bool
	// withdrawn: the host is leaving, so nothing is announced, while the
	// sessions and the local routes stay (setWithdrawn).
	withdrawn bool
	// want is the last set of addresses synced.
	want []netip.Addr
	// flows forwards the segments of flows the routers move here (nil:
	// off); it follows the addresses and the withdrawn state.
	flows *movedFlows
	// withdrawAfter delays the withdrawal when the host starts leaving, so
	// the other LB hosts forward this host's flows before the routers move
	// them; withdrawTimer is that pending withdrawal.
	withdrawAfter time.Duration
	withdrawTimer *time.Timer
}

// Sync makes the host accept want before announcing it, so traffic that the
// announcement attracts finds the address local.
func (a *addressSinks) Sync(want []netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retired {
		return nil
	}
	a.want = want
	var errs []error
	if a.local != nil {
		errs = append(errs, a.local.Sync(want))
	}
	a.flows.setAddresses(want)
	errs = append(errs, a.announceLocked())
	return errors.Join(errs...)
}

// announceLocked announces the wanted addresses, or none while withdrawn.
func (a *addressSinks) announceLocked() error {
	if a.bgp == nil {
		return nil
	}
	if a.withdrawn {
		return a.bgp.Sync(nil)
	}
	return a.bgp.Sync(a.want)
}

// setWithdrawn withdraws every announcement while the host is leaving
// (routers move new flows to the other hosts; the sessions stay up, so
// coming back is one update), and announces again when it no longer is.
// The withdrawal waits withdrawAfter, for the other LB hosts to forward
// this host's flows once the routers move them (they watch the same
// Node). The host keeps accepting the addresses for its established
// connections and the stragglers of the routers' convergence: refusing
// them would turn a slow router into failed requests.
func (a *addressSinks) setWithdrawn(log logr.Logger, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flows.setDraining(on)
	if a.withdrawTimer != nil {
		a.withdrawTimer.Stop()
		a.withdrawTimer = nil
	}
	apply := func() {
		a.withdrawn = on
		if a.retired {
			return
		}
		if err := a.announceLocked(); err != nil {
			log.Error(err, "Changing the announcements")
		}
	}
	if !on || a.withdrawAfter <= 0 {
		apply()
		return
	}
	a.withdrawTimer = time.AfterFunc(a.withdrawAfter, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		apply()
	})
}

// connectBGP opens the BGP sessions a deferred speaker has not opened.
func (a *addressSinks) connectBGP(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bgp == nil || a.retired {
		return nil
	}
	return a.bgp.Connect(ctx)
}

// withdraw stops announcing the addresses (BGP withdraws its routes) and
// reports whether there was anything announced; the host still accepts
// them, for the established connections.
func (a *addressSinks) withdraw() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bgp == nil {
		return false
	}
	a.bgp.Stop()
	a.bgp = nil
	return true
}

// retire leaves the addresses to a successor on this host: the BGP
// sessions close without a notification, so routers that negotiated
// graceful restart keep the routes until the successor's speaker
// re-announces them, and the local routes stay.
func (a *addressSinks) retire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retired = true
	a.flows.retire()
	if a.bgp != nil {
		a.bgp.StopForSuccessor()
		a.bgp = nil
	}
}

// close withdraws every announcement, then removes the local routes;
// retired, it only lets go of the routing table.
func (a *addressSinks) close(log logr.Logger) {
	a.withdraw()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.withdrawTimer != nil {
		a.withdrawTimer.Stop()
	}
	a.flows.close()
	if a.local == nil {
		return
	}
	if !a.retired {
		if err := a.local.Sync(nil); err != nil {
			log.Error(err, "Removing the local routes of the load balancer's addresses")
		}
	}
	a.local.Close()
	a.local = nil
}
