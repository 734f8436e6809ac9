package kubelet_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// TestARebootedNodeStartsItsPodsAgain reboots a real node (every process of
// it killed at once, then containerd and kubelet started again with their
// state on disk): its pod stays the same pod in the API, and the node's
// kubelet starts its container again, which answers on the pod's IP.
func TestARebootedNodeStartsItsPodsAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "node-3"
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	dep := localcluster.AgnhostDeployment(ns, "app", 1)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	before := onlyPod(t, ctx, ns, "app=app")
	url := fmt.Sprintf("http://%s:8080/hostname", before.Status.PodIP)
	client := &http.Client{Timeout: 2 * time.Second}
	if got, err := appclient.Hostname(ctx, client, url); err != nil || got != before.Name {
		t.Fatalf("GET %s before the reboot = %q, %v; want %q", url, got, err, before.Name)
	}

	rebooted := time.Now()
	if err := cluster.RebootNode(ctx, node, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s rebooted in %s", node, time.Since(rebooted).Round(10*time.Millisecond))
	var after corev1.Pod
	e2eutil.Eventually(t, ctx, 2*time.Minute, "the pod's container started again after the reboot and Ready", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		after = *p
		if len(p.Status.ContainerStatuses) == 0 {
			return false, "no container status"
		}
		cs := p.Status.ContainerStatuses[0]
		running := cs.State.Running
		return running != nil && running.StartedAt.After(rebooted.Add(-time.Second)) && cs.Ready,
			fmt.Sprintf("state %+v, ready %v, restarts %d", cs.State, cs.Ready, cs.RestartCount)
	})
	// A reboot keeps the node's pods: no replacement was made.
	if pods := onlyPod(t, ctx, ns, "app=app"); pods.UID != before.UID {
		t.Errorf("the app's pod is %s (%s), was %s (%s): a reboot keeps the node's pods", pods.Name, pods.UID, before.Name, before.UID)
	}
	// The pod's address as the API gives it now: its new sandbox may get
	// a new one. A clean-clone CI run dialled the address read with the
	// first Ready status for 30 s and got "no route to host": most likely
	// the old sandbox's address, still in a status written before the new
	// sandbox's (not proven: that run's logs are gone).
	e2eutil.Eventually(t, ctx, 30*time.Second, "the pod answering on its address after the reboot", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		after = *p
		got, err := appclient.Hostname(ctx, client, fmt.Sprintf("http://%s:8080/hostname", p.Status.PodIP))
		return err == nil && got == before.Name, fmt.Sprintf("%s: %q, %v", p.Status.PodIP, got, err)
	})
	t.Logf("pod %s: restarts %d, IP %s (was %s)", after.Name, after.Status.ContainerStatuses[0].RestartCount, after.Status.PodIP, before.Status.PodIP)
}
