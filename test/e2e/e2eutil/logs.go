package e2eutil

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// ComponentLogs returns the last lines of the logs of ebb's pods that
// match selector (e.g. "app.kubernetes.io/name=ebb-lb"), read through the
// API as kubectl logs does, each under its pod's name; for a failure's
// message. An error reading them is part of the text.
func ComponentLogs(ctx context.Context, c *localcluster.Cluster, selector string, lines int64) string {
	pods, err := c.Client.CoreV1().Pods(ebbrun.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("listing the pods %s for their logs: %v", selector, err)
	}
	var out []string
	for _, p := range pods.Items {
		// A container that restarted: its previous run's log says why.
		for _, previous := range []bool{true, false} {
			if previous && !restarted(&p) {
				continue
			}
			which := "last"
			if previous {
				which = "previous run's last"
			}
			data, err := c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr.To(lines), Previous: previous}).DoRaw(ctx)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: reading its %s lines: %v", p.Name, which, err))
				continue
			}
			out = append(out, fmt.Sprintf("%s, %s %d lines:\n%s", p.Name, which, lines, data))
		}
	}
	return strings.Join(out, "\n")
}

// restarted reports whether a container of the pod has restarted.
func restarted(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			return true
		}
	}
	return false
}
