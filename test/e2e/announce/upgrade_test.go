package announce_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A rolling upgrade of the ebb lb DaemonSet (`kubectl rollout restart`)
// under traffic from a client behind the router drops nothing: every new
// connection is served, long-lived connections opened before the upgrade
// keep working through it, the router never loses a next hop (each new
// pod takes its host's sockets and BGP session over; graceful restart keeps
// the routes), and each new ebb lb says it took over.
func TestRollingUpgradeDropsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbA, lbB := cluster.Nodes[0], cluster.Nodes[1]
	startLB(t, ctx, lbA)
	startLB(t, ctx, lbB)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 2)
	route := netip.PrefixFrom(vip, 32)
	both := []netip.Addr{netip.MustParseAddr(lbA.IP), netip.MustParseAddr(lbB.IP)}
	waitNextHops(t, ctx, route, both)
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", vip)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		_, err := e2eutil.GetIdentity(ctx, client, url)
		return err == nil, fmt.Sprint(err)
	})
	oldPods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}

	requests := startRequests(t, ctx, client, url, 2)
	long := startLongLived(t, ctx, netip.AddrPortFrom(vip, 80), 4)
	routes := watchRoute(t, ctx, route, both)
	time.Sleep(time.Second)

	started := time.Now()
	if err := ebbrun.RolloutRestartLB(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	t.Logf("new ebb lb pods ready on both hosts %s after the restart", time.Since(started).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	// The old pods serve the long-lived connections until they end.
	long.halt()
	e2eutil.Eventually(t, ctx, time.Minute, "the old ebb lb pods gone", func(ctx context.Context) (bool, string) {
		pods, err := ebbrun.LBPods(ctx, cluster)
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range pods {
			if slices.ContainsFunc(oldPods, func(o corev1.Pod) bool { return o.UID == p.UID }) {
				left = append(left, p.Name)
			}
		}
		return len(left) == 0, fmt.Sprint("left: ", left)
	})
	time.Sleep(time.Second)
	requests.halt()
	routes.halt()

	t.Logf("%d requests on new connections, %d on 4 long-lived connections", requests.ok.Load(), long.ok.Load())
	if n := requests.failed.Load(); n > 0 {
		t.Errorf("%d of %d requests on new connections failed; first: %v", n, n+requests.ok.Load(), requests.firstErr.Load())
	}
	if n := long.failed.Load(); n > 0 {
		t.Errorf("%d of 4 long-lived connections broke; first: %v", n, long.firstErr.Load())
	}
	if long.ok.Load() == 0 || requests.ok.Load() == 0 {
		t.Error("no traffic went through during the upgrade")
	}
	if n := routes.failed.Load(); n > 0 {
		t.Errorf("the router lost a next hop of %s %d times during the upgrade; first: %v", route, n, routes.firstErr.Load())
	}
	for _, node := range []localcluster.Node{lbA, lbB} {
		page, err := lbPage(ctx, node, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(page, `ebb_lb_handoffs_total{result="success",role="successor"} 1`) {
			t.Errorf("the new ebb lb on %s did not take over from the old one:\n%s", node.Name, grepLines(page, "ebb_lb_handoffs_total"))
		}
	}
	// Each hand-off is an Event on the node, as `kubectl get events` shows.
	e2eutil.Eventually(t, ctx, 30*time.Second, "a LoadBalancerTookOver Event on each LB host", func(ctx context.Context) (bool, string) {
		list, err := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + lbsync.ReasonLoadBalancerTookOver})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]string{}
		for _, e := range list.Items {
			seen[e.Regarding.Name] = e.Note
		}
		return seen[lbA.Name] != "" && seen[lbB.Name] != "", fmt.Sprint(seen)
	})
}

// load counts the successes and failures of something repeated until
// halted.
type load struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       chan struct{}
	once       sync.Once
	wg         sync.WaitGroup
}

// newLoad returns a load that is halted when the test ends, if not before
// (a failed test must not leave it running into the next).
func newLoad(t *testing.T) *load {
	l := &load{stop: make(chan struct{})}
	t.Cleanup(l.halt)
	return l
}

func (l *load) fail(err error) {
	l.failed.Add(1)
	l.firstErr.CompareAndSwap(nil, err)
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *load) halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// startRequests sends requests, each on a new connection, one after
// another on each of workers.
func startRequests(t *testing.T, ctx context.Context, client *http.Client, url string, workers int) *load {
	l := newLoad(t)
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for !l.stopped() {
				if _, err := e2eutil.GetIdentity(ctx, client, url); err != nil {
					l.fail(err)
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	return l
}

// startLongLived opens n connections and sends a request on each every
// 100 ms until halted; a connection that breaks counts one failure and
// ends.
func startLongLived(t *testing.T, ctx context.Context, at netip.AddrPort, n int) *load {
	l := newLoad(t)
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c, err := cluster.ExternalClient.DialContext(ctx, "tcp", at.String())
			if err != nil {
				l.fail(fmt.Errorf("long-lived connection %d: %w", i, err))
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			for !l.stopped() {
				if err := keepAliveRequest(c, r, at); err != nil {
					l.fail(fmt.Errorf("long-lived connection %d after %d requests: %w", i, l.ok.Load(), err))
					return
				}
				l.ok.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	return l
}

// keepAliveRequest sends one HTTP/1.1 request on c and reads its answer,
// leaving the connection open.
func keepAliveRequest(c net.Conn, r *bufio.Reader, at netip.AddrPort) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", at); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// watchRoute checks every 200 ms that the router's route has want as its
// next hops, counting each time it does not.
func watchRoute(t *testing.T, ctx context.Context, route netip.Prefix, want []netip.Addr) *load {
	l := newLoad(t)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for !l.stopped() {
			routes, err := router.Routes(ctx)
			switch {
			case err != nil:
				l.fail(err)
			case !slices.Equal(routes[route], want):
				// FRR's detail says whether the route was withdrawn or
				// only between selection and installation (the flake of
				// 2026-11-26 03:03, when no request failed).
				at := time.Now().Format(time.TimeOnly)
				l.fail(fmt.Errorf("%s via %v at %s; FRR's detail right after:\n%s", route, routes[route], at, router.RouteDetail(ctx, route)))
			default:
				l.ok.Add(1)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return l
}

func grepLines(page, substr string) string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
