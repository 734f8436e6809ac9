package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A pod deleted while a long-lived TCP connection is open keeps that
// connection working until its grace period ends; new connections are
// refused from the deletion on; at the end of the grace period the
// connection is closed.
func TestDeletedPodKeepsConnectionsForGracePeriod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	const grace = 6 * time.Second
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long-lived"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(grace / time.Second)),
			Containers: []corev1.Container{{
				Name: "echo", Image: "ebb.dev/echo:local",
				Ports: []corev1.ContainerPort{{ContainerPort: 9000, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var addr string
	eventually(t, ctx, time.Minute, "the pod to run and accept connections", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.PodIP == "" {
			return false, fmt.Sprintf("pod IP not set (%v)", err)
		}
		addr = net.JoinHostPort(p.Status.PodIP, "9000")
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
	roundTrip := func(msg string) error {
		if _, err := conn.Write([]byte(msg)); err != nil {
			return fmt.Errorf("writing: %w", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, buf); err != nil {
			return fmt.Errorf("reading: %w", err)
		}
		if !bytes.Equal(buf, []byte(msg)) {
			return fmt.Errorf("echo %q, want %q", buf, msg)
		}
		return nil
	}
	if err := roundTrip("before deletion"); err != nil {
		t.Fatal(err)
	}

	deleted := time.Now()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 3*time.Second, "new connections to be refused", func(context.Context) (bool, string) {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return false, "a new connection was accepted"
		}
		return true, ""
	})
	// Keep using the connection through the grace period.
	for i := 0; time.Since(deleted) < grace-time.Second; i++ {
		if err := roundTrip(fmt.Sprintf("message %d, %s after deletion", i, time.Since(deleted).Round(time.Millisecond))); err != nil {
			t.Fatalf("%s after deletion, within the %s grace period: %v", time.Since(deleted).Round(time.Millisecond), grace, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// At the end of the grace period the pod's server closes the connection.
	_ = conn.SetReadDeadline(time.Now().Add(grace))
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	closedAt := time.Since(deleted)
	if err == nil {
		t.Fatalf("read %q %s after deletion; want the connection closed at the end of the grace period", buf[:n], closedAt.Round(time.Millisecond))
	}
	if closedAt < grace-500*time.Millisecond || closedAt > grace+3*time.Second {
		t.Errorf("connection closed %s after deletion (%v); want about the %s grace period", closedAt.Round(time.Millisecond), err, grace)
	}
}
