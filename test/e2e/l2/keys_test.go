package l2_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// The L2 heartbeats are signed with a key the controller created at
// install, and the key is rotated the way docs/l2.md says, in three edits
// of the Secret, under load: the address stays where it is, no request
// fails and no replica refuses another's heartbeat at any step.
func TestL2HeartbeatKeyRotatesWithoutAMove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbs := []localcluster.Node{cluster.Nodes[0], cluster.Nodes[1]}
	_, macs := lbHosts(t, ctx, lbs...)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: cluster.Nodes[2].Name}
	})
	secrets := cluster.Client.CoreV1().Secrets("ebb-system")
	s, err := secrets.Get(ctx, "ebb-l2-key", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the controller created no heartbeat key Secret: %v", err)
	}
	if len(s.Data) != 1 || len(s.Data["key-1"]) != 32 {
		t.Fatalf("the created Secret holds %d fields, want one 32-byte key-1", len(s.Data))
	}
	waitKeys(t, ctx, lbs, `id="key-1",signing="true"`)
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+vip.String()+" through an owner", func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, "http://"+vip.String()+"/")
		return err == nil && routerOwner(macs, vip) != "", fmt.Sprint(err)
	})
	owner := routerOwner(macs, vip)
	refusedBefore, takeoversBefore := l2Sum(t, ctx, lbs, `ebb_lb_l2_heartbeats_refused_total{reason="unauthenticated"}`), l2Sum(t, ctx, lbs, "ebb_lb_l2_takeovers_total")

	load := startLoad(vip)
	next := make([]byte, 32)
	if _, err := rand.Read(next); err != nil {
		t.Fatal(err)
	}
	// 1. The new key is accepted everywhere, the old one still signs.
	editKeys(t, ctx, func(d map[string][]byte) { d["key-2"], d["signing-key"] = next, []byte("key-1") })
	waitKeys(t, ctx, lbs, `id="key-2",signing="false"`)
	time.Sleep(time.Second) // each state a while under load
	// 2. Every replica signs with the new key.
	editKeys(t, ctx, func(d map[string][]byte) { d["signing-key"] = []byte("key-2") })
	waitKeys(t, ctx, lbs, `id="key-2",signing="true"`)
	time.Sleep(time.Second)
	// 3. The old key goes.
	editKeys(t, ctx, func(d map[string][]byte) { delete(d, "key-1") })
	e2eutil.Eventually(t, ctx, 30*time.Second, "every LB host dropping key-1", func(ctx context.Context) (bool, string) {
		for _, n := range lbs {
			if page := lbPage(t, ctx, n); strings.Contains(page, `id="key-1"`) {
				return false, n.Name + " still accepts key-1"
			}
		}
		return true, ""
	})
	time.Sleep(time.Second)
	load.Stop()
	sent, failed := load.Counts()
	if failed > 0 || sent == 0 {
		t.Fatalf("%d of %d requests failed while the key rotated (last: %s)", failed, sent, load.LastError())
	}
	if now := routerOwner(macs, vip); now != owner {
		t.Errorf("%s moved from %s to %s while the key rotated", vip, owner, now)
	}
	if n := l2Sum(t, ctx, lbs, "ebb_lb_l2_takeovers_total") - takeoversBefore; n != 0 {
		t.Errorf("%v takeovers while the key rotated, want none", n)
	}
	if n := l2Sum(t, ctx, lbs, `ebb_lb_l2_heartbeats_refused_total{reason="unauthenticated"}`) - refusedBefore; n != 0 {
		t.Errorf("%v heartbeats refused as unauthenticated while the key rotated, want none", n)
	}
	t.Logf("key rotated in three steps: %s stayed at %s, 0 of %d requests failed", vip, owner, sent)
}

// editKeys changes the heartbeat key Secret's data.
func editKeys(t *testing.T, ctx context.Context, edit func(map[string][]byte)) {
	t.Helper()
	secrets := cluster.Client.CoreV1().Secrets("ebb-system")
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := secrets.Get(ctx, "ebb-l2-key", metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(s.Data)
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("editing the heartbeat key Secret: %v", err)
	}
}

// waitKeys waits until every LB host's ebb_lb_l2_heartbeat_key_info has a
// sample with labels.
func waitKeys(t *testing.T, ctx context.Context, lbs []localcluster.Node, labels string) {
	t.Helper()
	e2eutil.Eventually(t, ctx, 30*time.Second, "every LB host with key "+labels, func(ctx context.Context) (bool, string) {
		for _, n := range lbs {
			page := lbPage(t, ctx, n)
			found := false
			for _, l := range strings.Split(e2eutil.GrepLines(page, "ebb_lb_l2_heartbeat_key_info{"), "\n") {
				all := strings.HasSuffix(l, "} 1")
				for _, label := range strings.Split(labels, ",") {
					all = all && strings.Contains(l, label)
				}
				found = found || all
			}
			if !found {
				return false, n.Name + ": " + e2eutil.GrepLines(page, "ebb_lb_l2_heartbeat_key_info")
			}
		}
		return true, ""
	})
}

// l2Sum adds one metric up over the LB hosts: its samples whose line
// holds metric (a name, or a name and some of its labels).
func l2Sum(t *testing.T, ctx context.Context, lbs []localcluster.Node, metric string) float64 {
	t.Helper()
	name, _, _ := strings.Cut(metric, "{")
	total := 0.0
	for _, n := range lbs {
		total += e2eutil.Sum(e2eutil.GrepLines(lbPage(t, ctx, n), metric), name)
	}
	return total
}

func lbPage(t *testing.T, ctx context.Context, n localcluster.Node) string {
	t.Helper()
	page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return page
}
