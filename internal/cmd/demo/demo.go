// Package demo implements `ebb demo`: ebb's main job shown on the embedded
// local cluster. Today it starts the cluster, deploys a sample app behind a
// Service and shows traffic reaching every pod through every node; the node
// maintenance scenario joins it when the controllers land.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/cmd/cluster"
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
		Short: "Start a local cluster, deploy a sample app and show it serving",
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
	cmd.Flags().IntVar(&o.Requests, "requests", 300, "HTTP requests to send through the node ports")
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
	const ns, name = metav1.NamespaceDefault, "echo"
	fmt.Fprintf(out, "[demo] deploying %s: a Deployment of %d replicas behind a NodePort Service\n", name, o.Replicas)
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, localcluster.EchoDeployment(ns, name, o.Replicas), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the sample deployment: %w", err)
	}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, localcluster.EchoService(ns, name, corev1.ServiceTypeNodePort), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the sample service: %w", err)
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		return err
	}
	if err := c.WaitServiceEndpoints(ctx, ns, name, int(o.Replicas), time.Minute); err != nil {
		return err
	}
	nodePort := svc.Spec.Ports[0].NodePort
	fmt.Fprintf(out, "[demo] sending %d HTTP requests round robin to the %d nodes' port %d\n", o.Requests, len(c.Nodes), nodePort)
	hits, failed := o.drive(ctx, c, nodePort)
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

// drive sends the requests and counts the answers per pod.
func (o *Options) drive(ctx context.Context, c *localcluster.Cluster, nodePort int32) (map[podserver.Identity]int, int) {
	// A new connection per request, so that each one is balanced anew.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	hits := map[podserver.Identity]int{}
	failed := 0
	for i := range o.Requests {
		node := c.Nodes[i%len(c.Nodes)]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/", node.IP, nodePort), nil)
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
