package kernel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// Taking the eBPF path away (the DaemonSet's arguments back to
// config/default's, as applying dist/install.yaml over
// dist/install-kernel-ebpf.yaml does) hands the Service to the proxy under
// traffic: each new ebb lb finds the program and maps its predecessor
// pinned, removes them, and from then on the proxy takes every new
// connection (before, the program went on forwarding them with the maps
// as the old pod left them). The connections the program carried end
// with it: a request in flight at that moment fails, and no other. Putting the path back serves it on eBPF again.
func TestTakingTheEBPFPathAwayHandsTheServiceToTheProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := deployService(t, ctx)
	expectEBPF(t, ctx, s)
	if pins := lbPins(t); len(pins) != len(s.LBs) {
		t.Fatalf("the eBPF path's pins: %v; want one directory per LB host", pins)
	}
	requests := e2eutil.StartRequests(t, ctx, s.Client, s.URL, 2)

	ebpfArgs := setLBArgs(t, ctx, func(args []string) []string {
		return slices.DeleteFunc(args, func(a string) bool { return a == "--engine=Auto" || a == "--kernel-path=ebpf" })
	})
	t.Cleanup(func() { setLBArgs(t, context.Background(), func([]string) []string { return ebpfArgs }) })
	for _, n := range s.LBs {
		e2eutil.Eventually(t, ctx, time.Minute, n.Name+"'s ebb lb serving the Service's TCP port by the proxy", func(ctx context.Context) (bool, string) {
			page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
			engines := e2eutil.GrepLines(page, "ebb_dataplane_frontend_engine{")
			return err == nil && strings.Contains(engines, `/TCP@`) && !strings.Contains(engines, `engine="Kernel"`), fmt.Sprint(engines, err)
		})
	}
	if pins := lbPins(t); len(pins) != 0 {
		t.Errorf("pins left after the eBPF path was taken away: %v", pins)
	}
	// The proxy, not a program left behind, answers new connections now.
	proxied := func() float64 {
		var sum float64
		for _, n := range s.LBs {
			page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			sum += e2eutil.Sum(e2eutil.GrepLines(page, "/TCP@"), "ebb_dataplane_connections_total")
		}
		return sum
	}
	before := proxied()
	time.Sleep(2 * time.Second)
	if after := proxied(); after-before < 10 {
		t.Errorf("the proxies took %.0f connections in 2 s of requests; want them all", after-before)
	}
	requests.Halt()
	t.Logf("%d requests on new connections through the switch", requests.OK.Load())
	// The flows the program carried end with it, when the new ebb lb
	// removes it: a request in flight on one fails (reset, or left
	// unanswered). Each of the two workers has one open at a time, so at
	// most two fail on each host's switch, and no other request may.
	for _, err := range requests.Errors() {
		t.Logf("failed during the switch: %v", err)
	}
	if n := requests.Failed.Load(); n > int64(2*len(s.LBs)) {
		t.Errorf("%d of %d requests on new connections failed; want none but those in flight when the program went (at most %d)", n, n+requests.OK.Load(), 2*len(s.LBs))
	}
	if slow := requests.Slow.Load(); slow*100 > requests.OK.Load() {
		t.Errorf("%d of %d requests took %s or more", slow, requests.OK.Load(), e2eutil.SlowRequest)
	}

	setLBArgs(t, ctx, func([]string) []string { return ebpfArgs })
	for _, n := range s.LBs {
		e2eutil.Eventually(t, ctx, time.Minute, n.Name+"'s ebb lb on the eBPF path again", func(ctx context.Context) (bool, string) {
			page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
			engines := e2eutil.GrepLines(page, "ebb_dataplane_frontend_engine{")
			return err == nil && strings.Contains(engines, `path="ebpf"`), fmt.Sprint(engines, err)
		})
	}
	expectEBPF(t, ctx, s)
}

// setLBArgs changes the ebb lb container's arguments, as editing the
// DaemonSet does, waits until every LB host runs a new pod, and returns
// the arguments it had.
func setLBArgs(t *testing.T, ctx context.Context, edit func([]string) []string) []string {
	t.Helper()
	oldPods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}
	dss := cluster.Client.AppsV1().DaemonSets(ebbrun.Namespace)
	var was []string
	changed := false
	// The DaemonSet controller writes the object too: read, edit and
	// update again on a conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dss.Get(ctx, ebbrun.LBDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c := &ds.Spec.Template.Spec.Containers[0]
		was = slices.Clone(c.Args)
		c.Args = edit(slices.Clone(c.Args))
		if changed = !slices.Equal(was, c.Args); !changed {
			return nil
		}
		_, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		return was
	}
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	return was
}

// lbPins lists the eBPF path's pin directories, one per network namespace
// (LB host), in the cluster's bpffs (this test process runs in the
// cluster's mount namespace).
func lbPins(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob("/sys/fs/bpf/ebb/netns-*")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "ebb")); err == nil {
			out = append(out, d)
		}
	}
	return out
}
