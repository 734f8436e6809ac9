package cluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// A pod deleted while a kept-alive connection is open, as the real kubelet
// ends it: the preStop sleep, then SIGTERM, then the app's own shutdown
// (netexec's --delay-shutdown). The connection keeps working through both,
// ends when the app exits, well before the grace period would force it,
// and the pod is gone from the API right after. This is the sequence
// ebb's drains rely on: an app keeps serving for as long as it chooses.
func TestDeletedPodServesUntilItsAppExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	// The grace period is long so that the connection's end tells the
	// app's exit from the kubelet's kill by far more than a busy machine
	// can delay either (the test takes as long whatever the grace, when
	// it passes).
	const preStop, delay, grace = 2 * time.Second, 3 * time.Second, 90 * time.Second
	dep := localcluster.AgnhostDeployment(ns, "long-lived", 1)
	spec := dep.Spec.Template.Spec
	spec.TerminationGracePeriodSeconds = ptr.To(int64(grace / time.Second))
	spec.Containers[0].Args = append(spec.Containers[0].Args, fmt.Sprintf("--delay-shutdown=%d", delay/time.Second))
	spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: int64(preStop / time.Second)}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long-lived"}, Spec: spec}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var addr string
	eventually(t, ctx, time.Minute, "the pod to run and answer", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.PodIP == "" {
			return false, fmt.Sprintf("pod IP not set (%v)", err)
		}
		addr = net.JoinHostPort(p.Status.PodIP, "8080")
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	echo := func(i int) error {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		return loadgen.EchoHTTP(conn, r, addr, i)
	}
	if err := echo(0); err != nil {
		t.Fatal(err)
	}

	deleted := time.Now()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var lastOK time.Duration
	var endErr error
	for i := 1; time.Since(deleted) < grace; i++ {
		if endErr = echo(i); endErr != nil {
			break
		}
		lastOK = time.Since(deleted)
		time.Sleep(200 * time.Millisecond)
	}
	ended := time.Since(deleted)
	t.Logf("the kept-alive connection answered until %s after deletion, then ended (%v) at %s", lastOK.Round(time.Millisecond), endErr, ended.Round(time.Millisecond))
	if lastOK < preStop+delay-time.Second {
		t.Errorf("the connection answered only until %s after deletion, want through the preStop sleep and the app's %s delay (%s)", lastOK.Round(time.Millisecond), delay, preStop+delay)
	}
	if endErr == nil || ended > grace/2 {
		t.Errorf("the connection ended %s after deletion (%v), want when the app exits, %s after deletion, not at the %s grace period", ended.Round(time.Millisecond), endErr, preStop+delay, grace)
	}
	eventually(t, ctx, 20*time.Second, "the pod gone from the API after its app exited", func(ctx context.Context) (bool, string) {
		_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
