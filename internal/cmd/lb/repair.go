package lb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// repairEvery is how often ebb lb checks that its state in the host's
// kernel is still there.
const repairEvery = 5 * time.Second

// repairPart is one piece of kernel state and how to repair it.
type repairPart struct {
	name   string
	repair func() (bool, error)
}

// repairParts repairs each part, returning the names of those it had to
// repair and every error, each named.
func repairParts(parts []repairPart) ([]string, error) {
	var repaired []string
	var errs []error
	for _, p := range parts {
		ok, err := p.repair()
		if ok {
			repaired = append(repaired, p.name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
		}
	}
	return repaired, errors.Join(errs...)
}

// kernelRepair writes again what someone else took out of the kernel.
// Debian's nftables service and firewalld run `nft flush ruleset` on a
// reload, which removes every table: ebb lb's guard, its forwarding of
// moved flows, its ARP rules and the kernel engine's tables, and nothing
// put them back until a configuration changed. Like kube-proxy's nftables
// mode, ebb lb checks periodically and rebuilds.
type kernelRepair struct {
	log     logr.Logger
	check   func() ([]string, error)
	repairs *prometheus.CounterVec

	mu       sync.Mutex
	onRepair func(parts []string)
}

func newKernelRepair(log logr.Logger, reg prometheus.Registerer, check func() ([]string, error)) (*kernelRepair, error) {
	r := &kernelRepair{log: log.WithName("repair"), check: check,
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_lb_kernel_state_repairs_total",
			Help: "Times a part of ebb lb's state in the host's kernel was found removed or changed by someone else (a firewall reload, nft flush ruleset) and written again; part is guard, flows, arp or kernel."}, []string{"part"})}
	for _, part := range []string{"guard", "flows", "arp", "kernel"} {
		r.repairs.WithLabelValues(part)
	}
	if err := reg.Register(r.repairs); err != nil {
		return nil, fmt.Errorf("registering the repair metrics: %w", err)
	}
	return r, nil
}

// setOnRepair makes f told the parts of each repair.
func (r *kernelRepair) setOnRepair(f func(parts []string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onRepair = f
}

// run checks every period until ctx is done.
func (r *kernelRepair) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.once()
	}
}

func (r *kernelRepair) once() {
	parts, err := r.check()
	if err != nil {
		r.log.Error(err, "Checking ebb lb's state in the kernel")
	}
	if len(parts) == 0 {
		return
	}
	for _, p := range parts {
		r.repairs.WithLabelValues(p).Inc()
	}
	r.log.Info("Something else removed or changed ebb lb's state in the kernel (a firewall reload?): wrote it again", "parts", parts)
	r.mu.Lock()
	onRepair := r.onRepair
	r.mu.Unlock()
	if onRepair != nil {
		onRepair(parts)
	}
}
