package install_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestBothControllerReplicasRunOneLeads(t *testing.T) {
	ctx := context.Background()
	pods, err := cluster.Client.CoreV1().Pods("ebb-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Logf("%s on %s: %s ip %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP)
	}
	_ = time.Second
}
