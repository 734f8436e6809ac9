// Package cluster_test checks that the local cluster behaves like a real
// one where ebb depends on it: node ports, kube-proxy's health checks, the
// Eviction API with PodDisruptionBudgets, and graceful pod termination.
package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunTests(m, localcluster.Options{Name: "e2e-cluster", Nodes: 3}, &cluster))
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	// Pods need the namespace's default service account (ServiceAccount
	// admission is on), which the controller manager creates.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("waiting for the default service account of %s: %v", ns.Name, err)
	}
	return ns.Name
}

// getIdentity sends GET url and decodes the echo server's answer.
func getIdentity(ctx context.Context, client *http.Client, url string) (podserver.Identity, int, error) {
	var id podserver.Identity
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return id, 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return id, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return id, resp.StatusCode, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return id, resp.StatusCode, json.NewDecoder(resp.Body).Decode(&id)
}

// eventually polls cond until it holds or timeout passes, then fails with
// the last reason cond gave.
func eventually(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, reason := cond(ctx)
		last = reason
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s: %s", what, timeout, last)
	}
}
