package localcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// PreemptionSource is the emitter of the PreemptScheduled Events on AKS:
// node-problem-detector's custom plugin monitor, reading the VM's
// scheduled events.
const PreemptionSource = "custom-plugin-monitor"

// EmitPreemptScheduled creates the Event AKS's node-problem-detector
// writes before a spot node is evicted: reason PreemptScheduled, in
// namespace default, from its custom plugin monitor on the node, about
// the node by name with the node's name as its UID (as
// node-problem-detector and kubelet write it).
func (c *Cluster) EmitPreemptScheduled(ctx context.Context, node string) error {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "preempt-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node), APIVersion: "v1"},
		Reason:         lbmodel.ReasonPreemptScheduled,
		Message:        "Preemption is scheduled",
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: PreemptionSource, Host: node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating a PreemptScheduled Event about node %s: %w", node, err)
	}
	return nil
}
