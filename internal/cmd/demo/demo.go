// Package demo implements `ebb demo`: ebb's main job shown on the embedded
// local cluster. Today it starts the cluster with ebb's controller and load
// balancer, deploys a sample app behind an ebb.dev/l4 LoadBalancer Service
// and shows traffic through its address reaching every pod on every node;
// the node maintenance scenario joins it when those controllers land.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// Options are the demo's flags.
type Options struct {
	Nodes    int
	Replicas int32
	Requests int
}

// NewCommand returns `ebb demo`.
func NewCommand() *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a local cluster with ebb, deploy a sample app behind an ebb load balancer and show it serving",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !localcluster.InNamespace() {
				code, err := localcluster.Reexec()
				if err != nil {
					return err
				}
				if code != 0 {
					return &cluster.ExitError{Code: code}
				}
				return nil
			}
			return o.Run(cmd.Context(), os.Stdout)
		},
	}
	cmd.Flags().IntVar(&o.Nodes, "nodes", 3, "number of simulated nodes")
	cmd.Flags().Int32Var(&o.Replicas, "replicas", 6, "replicas of the sample app")
	cmd.Flags().IntVar(&o.Requests, "requests", 300, "HTTP requests to send through the load balancer")
	return cmd
}

// Run runs the demo inside the private namespace.
func (o *Options) Run(ctx context.Context, out io.Writer) (retErr error) {
	if err := localcluster.SetupNamespace(); err != nil {
		return err
	}
	start := time.Now()
	c, err := localcluster.Start(ctx, localcluster.Options{Name: "demo", Nodes: o.Nodes, Progress: out})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "[demo] stopping the cluster")
		if err := c.Stop(); err != nil && retErr == nil {
			retErr = err
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the ebb binary: %w", err)
	}
	fmt.Fprintln(out, "[demo] starting ebb controller and ebb lb")
	stopEbb, err := cluster.StartEbb(c, self)
	if err != nil {
		return err
	}
	defer stopEbb()
	const ns, name = metav1.NamespaceDefault, "echo"
	fmt.Fprintf(out, "[demo] deploying %s: a Deployment of %d replicas behind a LoadBalancer Service of class %s\n", name, o.Replicas, lbmodel.ClassL4)
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, localcluster.EchoDeployment(ns, name, o.Replicas), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the sample deployment: %w", err)
	}
	svc := localcluster.EchoService(ns, name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the sample service: %w", err)
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		return err
	}
	if err := c.WaitServiceEndpoints(ctx, ns, name, int(o.Replicas), time.Minute); err != nil {
		return err
	}
	vip, err := waitAddress(ctx, c, ns, name)
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(vip, "80") + "/"
	// The load balancer picks the Service up within moments of its address.
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			break
		}
		if time.Since(start) > 30*time.Second {
			return fmt.Errorf("no answer through %s within 30s", url)
		}
	}
	fmt.Fprintf(out, "[demo] the load balancer serves %s at %s; sending %d HTTP requests, each on a new connection\n", name, vip, o.Requests)
	hits, failed := o.drive(ctx, url)
	fmt.Fprintf(out, "\nRequests: %d sent, %d failed. Pods that answered:\n", o.Requests, failed)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tREQUESTS")
	keys := make([]podserver.Identity, 0, len(hits))
	for id := range hits {
		keys = append(keys, id)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Pod < keys[j].Pod })
	for _, id := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", id.Pod, id.Node, hits[id])
	}
	_ = tw.Flush()
	fmt.Fprintf(out, "\n[demo] done in %s\n", time.Since(start).Round(100*time.Millisecond))
	if failed > 0 {
		return fmt.Errorf("%d of %d requests failed", failed, o.Requests)
	}
	return nil
}

// waitAddress waits for the Service's load-balancer address.
func waitAddress(ctx context.Context, c *localcluster.Cluster, ns, name string) (string, error) {
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(100 * time.Millisecond) {
		svc, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(svc.Status.LoadBalancer.Ingress) > 0 {
			return svc.Status.LoadBalancer.Ingress[0].IP, nil
		}
	}
	return "", fmt.Errorf("service %s/%s got no load-balancer address within 30s (logs in %s/logs)", ns, name, c.Dir())
}

// drive sends the requests and counts the answers per pod.
func (o *Options) drive(ctx context.Context, url string) (map[podserver.Identity]int, int) {
	// A new connection per request, so that each one is balanced anew.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	hits := map[podserver.Identity]int{}
	failed := 0
	for range o.Requests {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			failed++
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			failed++
			continue
		}
		var id podserver.Identity
		err = json.NewDecoder(resp.Body).Decode(&id)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			continue
		}
		id.Client, id.Path, id.Port = "", "", 0
		hits[id]++
	}
	return hits, failed
}
