// Package azurecmd implements `ebb azure`: one-shot Azure operations.
package azurecmd

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/provider/azure"
)

// InternalAnnotation marks an internal Azure LoadBalancer Service.
const InternalAnnotation = "service.beta.kubernetes.io/azure-load-balancer-internal"

// NewCommand returns `ebb azure`.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "azure", Short: "Azure operations (Basic to Standard load balancer migration)"}
	cmd.AddCommand(newMigrateCommand())
	return cmd
}

func newMigrateCommand() *cobra.Command {
	var cfgPath, kubeconfigPath string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "migrate-basic-lb",
		Short: "Move the cluster's Services from Basic to Standard Azure load balancers, keeping every address",
		Long: `Migrates the cluster from Basic to Standard Azure load balancers, as the
Basic-to-Standard design describes: the Basic load balancers are deleted,
the public IPs of external Services are upgraded to the Standard SKU in
place, internal Services get a frontend with the same private address, and
every node joins the Standard backend pool. Every Service keeps its
address. Safe to run again: a re-run, or a run after a crash, does only
what is left.

THIS MAY CAUSE DOWNTIME: Services do not answer between the deletion of
the Basic load balancers and the creation of the Standard ones. Standard
load balancers give no outbound connectivity by default: configure
outbound rules (or a NAT gateway) yourself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return migrate(cmd.Context(), cmd.OutOrStdout(), cfgPath, kubeconfigPath, dryRun)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "azure-config", "/etc/kubernetes/azure.json", "the azure.json file")
	cmd.Flags().StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

func migrate(ctx context.Context, out io.Writer, cfgPath, kubeconfigPath string, dryRun bool) error {
	cfg, err := azure.LoadConfig(cfgPath)
	if err != nil {
		return err
	}
	rest, err := kubeconfig.Load(kubeconfigPath)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	return Migrate(ctx, out, cfg, kube, dryRun)
}

// Migrate plans and (unless dryRun) runs the migration for the cluster
// kube talks to; `ebb controller --cloud azure --azure-migrate-on-start`
// runs it once at start when azure.json says the SKU is Standard.
func Migrate(ctx context.Context, out io.Writer, cfg *azure.Config, kube kubernetes.Interface, dryRun bool) error {
	if cfg.Location == "" || cfg.VnetName == "" || cfg.SubnetName == "" {
		return errors.New("the Azure configuration needs location, vnetName and subnetName to create the Standard load balancers")
	}
	services, nodeIPs, err := clusterAddresses(ctx, kube)
	if err != nil {
		return err
	}
	cred, err := cfg.Credential()
	if err != nil {
		return err
	}
	opts, err := cfg.ClientOptions()
	if err != nil {
		return err
	}
	m, err := azure.NewMigrator(cfg, cred, opts)
	if err != nil {
		return err
	}
	m.Location, m.SubnetID, m.VNetID = cfg.Location, cfg.SubnetID(), cfg.VNetID()
	steps, err := m.Plan(ctx, services, nodeIPs)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Migration of %d Service(s) and %d node(s) to Standard load balancers.\n", len(services), len(nodeIPs))
	fmt.Fprintln(out, "WARNING: this may cause downtime, and Standard load balancers give no outbound connectivity: configure outbound rules or a NAT gateway yourself.")
	if len(steps) == 0 {
		fmt.Fprintln(out, "Nothing to do: the cluster is on Standard load balancers.")
		return nil
	}
	for i, s := range steps {
		fmt.Fprintf(out, "  %d. %s\n", i+1, s.Description)
	}
	if dryRun {
		fmt.Fprintln(out, "Dry run: nothing changed.")
		return nil
	}
	if err := m.Run(ctx, steps, func(s string) { fmt.Fprintln(out, s) }); err != nil {
		return err
	}
	fmt.Fprintln(out, "Done: every Service keeps its address. Set loadBalancerSku to standard in azure.json if not done yet.")
	return nil
}

// clusterAddresses lists the LoadBalancer Services' addresses and the
// nodes' internal addresses.
func clusterAddresses(ctx context.Context, kube kubernetes.Interface) ([]azure.ServiceAddress, []string, error) {
	svcs, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing Services: %w", err)
	}
	var out []azure.ServiceAddress
	for _, s := range svcs.Items {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if ing.IP != "" {
				out = append(out, azure.ServiceAddress{Namespace: s.Namespace, Name: s.Name, IP: ing.IP, Internal: s.Annotations[InternalAnnotation] == "true"})
			}
		}
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	var ips []string
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, a.Address)
			}
		}
	}
	return out, ips, nil
}
