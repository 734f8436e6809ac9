package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

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
}

// Sync makes the host accept want before announcing it, so traffic that the
// announcement attracts finds the address local.
func (a *addressSinks) Sync(want []netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retired {
		return nil
	}
	var errs []error
	if a.local != nil {
		errs = append(errs, a.local.Sync(want))
	}
	if a.bgp != nil {
		errs = append(errs, a.bgp.Sync(want))
	}
	return errors.Join(errs...)
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
