package azure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// Node is what identifies a node's entries in backend pools: its
// addresses (IP-based pools, both families) and its provider ID (NIC-based
// pools: a scale-set VM's NIC IP configurations sit under its ID; a
// standalone VM's, in an availability set or a VMSS Flex, are looked up
// through the VM API).
type Node struct {
	Name       string
	IPs        []string
	ProviderID string

	// nics are the lower-case IDs of a standalone VM's network
	// interfaces, filled by the Manager.
	nics []string
}

// vmNICs caches a standalone VM's network interfaces for one provider ID.
type vmNICs struct {
	providerID string
	ids        []string
}

// owns reports whether a backend address entry is the node's.
func (n *Node) owns(p *armnetwork.LoadBalancerBackendAddressPropertiesFormat) bool {
	if p.IPAddress != nil && slices.Contains(n.IPs, *p.IPAddress) {
		return true
	}
	if p.NetworkInterfaceIPConfiguration == nil || p.NetworkInterfaceIPConfiguration.ID == nil {
		return false
	}
	id := strings.ToLower(*p.NetworkInterfaceIPConfiguration.ID)
	if pid := strings.ToLower(strings.TrimPrefix(n.ProviderID, "azure://")); pid != "" && strings.HasPrefix(id, pid+"/networkinterfaces/") {
		return true // a scale-set (Uniform) VM
	}
	return slices.ContainsFunc(n.nics, func(nic string) bool { return strings.HasPrefix(id, nic+"/ipconfigurations/") })
}

// standaloneVM returns the resource group and name of the VM a provider
// ID names when it is a VM resource of its own (availability set, VMSS
// Flex), not a scale-set instance.
func standaloneVM(providerID string) (rg, name string, ok bool) {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(providerID, "azure://"), "/"), "/")
	// subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>
	if len(parts) != 8 || !strings.EqualFold(parts[2], "resourceGroups") || !strings.EqualFold(parts[5], "Microsoft.Compute") || !strings.EqualFold(parts[6], "virtualMachines") {
		return "", "", false
	}
	return parts[3], parts[7], true
}

// resolveNICs fills in the network interfaces of the wanted nodes that are
// standalone VMs, when the pools are NIC-based: their NIC IP
// configurations carry the NIC's ID, which nothing in the Node object
// names. Cached per node and provider ID.
func (m *Manager) resolveNICs(ctx context.Context, want map[*Node]State) error {
	if m.cfg.LoadBalancerBackendPoolConfigurationType != PoolTypeNIC {
		return nil
	}
	var errs []error
	for n := range want {
		rg, vm, ok := standaloneVM(n.ProviderID)
		if !ok {
			continue
		}
		m.mu.Lock()
		cached, hit := m.nics[n.Name]
		m.mu.Unlock()
		if hit && cached.providerID == n.ProviderID {
			n.nics = cached.ids
			continue
		}
		resp, err := m.vms.Get(ctx, rg, vm, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading virtual machine %s of node %s for its network interfaces: %w", vm, n.Name, err))
			continue
		}
		var ids []string
		if p := resp.Properties; p != nil && p.NetworkProfile != nil {
			for _, ref := range p.NetworkProfile.NetworkInterfaces {
				if ref != nil && ref.ID != nil {
					ids = append(ids, strings.ToLower(*ref.ID))
				}
			}
		}
		n.nics = ids
		m.mu.Lock()
		m.nics[n.Name] = vmNICs{providerID: n.ProviderID, ids: ids}
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}

// UnmatchedError names nodes to be set Down that have no entry in any
// node pool of any load balancer: ebb cannot stop new connections to them,
// and says so rather than reporting success.
type UnmatchedError struct{ Nodes []string }

func (e *UnmatchedError) Error() string {
	return fmt.Sprintf("no backend pool entry matches node(s) %s (by address, scale-set provider ID, or the VM's network interfaces): their admin state cannot be set; check the pool type (loadBalancerBackendPoolConfigurationType) and the nodes' provider IDs", strings.Join(e.Nodes, ", "))
}

// unmatched returns an UnmatchedError for the Down nodes no pool holds,
// and forgets them so that every later call looks again.
func (m *Manager) unmatched(want map[*Node]State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for n, s := range want {
		if s == StateDown && !m.found[n.Name] {
			names = append(names, n.Name)
			for _, nodes := range m.applied {
				delete(nodes, n.Name)
			}
		}
	}
	m.m.setUnmatched(len(names))
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return &UnmatchedError{Nodes: names}
}
