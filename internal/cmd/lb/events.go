package lb

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// nodeRef is the Node an Event is about, by name: the replica need not
// read it first. Events about Nodes carry the node's name as UID, as the
// kubelet's do.
func nodeRef(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name)}}
}

// tookOver is the Event of a successful hand-off, from the successor.
func tookOver(node, pod string, pid, predecessor, sockets int) event.Event {
	return event.Event{Regarding: nodeRef(node), Type: corev1.EventTypeNormal, Reason: lbsync.ReasonLoadBalancerTookOver, Action: "HandOff",
		Note: fmt.Sprintf("ebb lb %s (pid %d) took over the %d listening socket(s) of the ebb lb before it on this node (pid %d) without refusing a connection; that process serves its established connections until they end", pod, pid, sockets, predecessor)}
}

// takeOverFailed is the Event of a hand-off the predecessor did not
// confirm.
func takeOverFailed(node, pod string, pid, predecessor int, err error) event.Event {
	return event.Event{Regarding: nodeRef(node), Type: corev1.EventTypeWarning, Reason: lbsync.ReasonLoadBalancerTakeOverFailed, Action: "HandOff",
		Note: fmt.Sprintf("ebb lb %s (pid %d) took the listening sockets of the ebb lb before it on this node (pid %d), which did not confirm the hand-off (%v): this process serves anyway; the other may still accept connections until it stops", pod, pid, predecessor, err)}
}

// kernelStateRepaired is the Event of ebb lb's kernel state written
// again after someone else removed or changed it.
func kernelStateRepaired(node string, parts []string) event.Event {
	return event.Event{Regarding: nodeRef(node), Type: corev1.EventTypeWarning, Reason: lbsync.ReasonKernelStateRepaired, Action: "Repair",
		Note: fmt.Sprintf("Something on this node (a firewall reload, nft flush ruleset) removed or changed ebb lb's nftables state (%s); ebb lb wrote it again within %s. Meanwhile the node's own services may have been reachable on the load-balancer addresses (guard), moved connections reset (flows), ARP answered by every LB host (arp) or kernel-engine frontends refused (kernel): make the firewall leave ebb's tables alone", strings.Join(parts, ", "), repairEvery)}
}
