package dataplane

import (
	"errors"
	"fmt"

	"github.com/google/nftables"

	"github.com/ebbdev/ebb/internal/nftstate"
)

// repairablePath is a kernel path that can tell when something else took
// its state out of the kernel.
type repairablePath interface {
	// intact reports whether the kernel still holds what the path
	// installed.
	intact() (bool, error)
	// forgetInstalled makes the next sync install everything again.
	forgetInstalled()
}

// RepairKernel installs the kernel engine's state again if something else
// removed it (a firewall reload runs `nft flush ruleset`, which takes the
// nftables path's tables: every kernel frontend stopped taking new flows),
// and reports whether it had to. Only the nftables path can tell; the eBPF
// path's attachments are bpf links that no firewall reload or tc change
// removes.
func (d *DataPlane) RepairKernel() (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.kernel.(repairablePath)
	if !ok || d.closed || d.handedOver || !d.kernelInstalled {
		return false, nil
	}
	if ok, err := r.intact(); err != nil || ok {
		return false, err
	}
	r.forgetInstalled()
	var errs []error
	for _, s := range d.syncKernelLocked(false) {
		errs = append(errs, s)
	}
	if len(errs) > 0 {
		return true, fmt.Errorf("repairing the kernel engine's tables: %w", errors.Join(errs...))
	}
	return true, nil
}

// intact reports whether both tables hold a services rule for each
// frontend installed in them (a flushed ruleset, table or chain, or a
// deleted rule, shows).
func (k *kernelEngine) intact() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.installed == nil {
		return true, nil // nothing is known to be there
	}
	want := map[nftables.TableFamily]int{nftables.TableFamilyIPv4: 0, nftables.TableFamilyIPv6: 0}
	for _, f := range k.installed {
		want[f.family]++
	}
	c, err := k.connect()
	if err != nil {
		return false, err
	}
	for fam, want := range want {
		n, err := nftstate.Rules(c, &nftables.Table{Name: k.table, Family: fam}, "services")
		if err != nil {
			k.dropConn()
			return false, fmt.Errorf("the kernel engine's tables: %w", err)
		}
		if n != want {
			return false, nil
		}
	}
	return true, nil
}

func (k *kernelEngine) forgetInstalled() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.forget()
}
