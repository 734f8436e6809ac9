package localcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// EmitPreemptScheduled creates the Event a cloud emits before evicting a
// spot node (reason PreemptScheduled, about the node by name and UID), as
// source would.
func (c *Cluster) EmitPreemptScheduled(ctx context.Context, node, source string) error {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading node %s: %w", node, err)
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "preempt-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: n.UID, APIVersion: "v1"},
		Reason:         lbmodel.ReasonPreemptScheduled,
		Message:        "Preemption is scheduled",
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: source},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating a PreemptScheduled Event about node %s: %w", node, err)
	}
	return nil
}
