// Package azurecmd implements `ebb azure`: one-shot Azure operations.
package azurecmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/provider/azure"
)

// cloud-provider-azure's Service annotations: an internal load balancer,
// and the address a Service asks for, per family.
const (
	InternalAnnotation = "service.beta.kubernetes.io/azure-load-balancer-internal"
	// InternalSubnetAnnotation names an internal Service's subnet.
	InternalSubnetAnnotation = "service.beta.kubernetes.io/azure-load-balancer-internal-subnet"
	IPv4Annotation           = "service.beta.kubernetes.io/azure-load-balancer-ipv4"
	IPv6Annotation           = "service.beta.kubernetes.io/azure-load-balancer-ipv6"
)

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
		Long: `Migrates the cluster from Basic to Standard Azure load balancers in the
order of the Basic-to-Standard design (SKU, restart, migrate), and leaves to
cloud-provider-azure what it builds itself. Run it twice:

  First, with loadBalancerSku still basic (or unset) in azure.json, it only makes
  every Service's address survive: Dynamic public IPs become Static in
  place, and each Service that does not ask for its address yet is pinned
  to it (annotation ` + IPv4Annotation + ` or -ipv6), so that
  cloud-provider-azure gives it the same one. Then set loadBalancerSku to
  standard in azure.json and restart cloud-controller-manager (one still on
  Basic would create again the load balancers the next run deletes).

  Second, with loadBalancerSku standard:
  1. every Basic load balancer of the cluster (named after the cluster or
     after one of its VM scale sets or availability sets, each with its
     -internal twin) is detached from the VM scale sets and network
     interfaces that reference its pools and deleted (Azure refuses it the
     other way round); those that hold internal Services' addresses are
     replaced in the same step by the Standard <cluster>-internal, holding
     the same frontends, so that nothing else in the subnet takes them;
  2. the public IPs are upgraded to the Standard SKU.
  cloud-provider-azure then builds the Standard load balancers (its own
  frontends, pools, rules and probes) with every Service's address and
  every node.

Services of another class (spec.loadBalancerClass, such as ebb's own
ebb.dev/l4) are not Azure's and are left alone. Safe to run again: a
re-run, or a run after a crash, does only what is left.

THIS MAY CAUSE DOWNTIME: Services do not answer between the deletion of
the Basic load balancers and cloud-provider-azure's next reconcile.
Standard load balancers give no outbound connectivity by default:
configure outbound rules (or a NAT gateway) yourself.`,
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
	services, err := serviceAddresses(ctx, kube)
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
	m.Pin = func(ctx context.Context, s azure.ServiceAddress) error { return pin(ctx, kube, s) }
	steps, err := m.Plan(ctx, services)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Migration of %d Service address(es) from Basic to Standard load balancers.\n", len(services))
	if m.WaitsForStandard() {
		fmt.Fprintln(out, "azure.json does not say loadBalancerSku standard: this run only keeps the addresses.")
	}
	fmt.Fprintln(out, "WARNING: this may cause downtime, and Standard load balancers give no outbound connectivity: configure outbound rules or a NAT gateway yourself.")
	if len(steps) == 0 {
		if m.WaitsForStandard() {
			fmt.Fprintln(out, "Nothing to do yet: every address is kept.")
			fmt.Fprintln(out, waitingStep)
			return nil
		}
		fmt.Fprintln(out, "Nothing to do: no Basic load balancer is left, and every address is kept.")
		fmt.Fprintln(out, nextStep)
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
	if m.WaitsForStandard() {
		fmt.Fprintln(out, "Done: every address is kept.")
		fmt.Fprintln(out, waitingStep)
		return nil
	}
	fmt.Fprintln(out, "Done: the Basic load balancers are gone and every address is kept.")
	fmt.Fprintln(out, nextStep)
	return nil
}

const (
	waitingStep = "Next, as the design says: set loadBalancerSku to standard in azure.json, restart cloud-controller-manager, and run this again (a cloud-controller-manager still on Basic would create again the load balancers it deletes)."
	nextStep    = "Next: cloud-controller-manager (on Standard, restarted) builds the Standard load balancers with every Service's address and every node at its next reconcile."
)

// serviceAddresses lists the addresses of the LoadBalancer Services
// cloud-provider-azure serves (those without a spec.loadBalancerClass).
func serviceAddresses(ctx context.Context, kube kubernetes.Interface) ([]azure.ServiceAddress, error) {
	svcs, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	var out []azure.ServiceAddress
	for _, s := range svcs.Items {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer || s.Spec.LoadBalancerClass != nil {
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if ing.IP == "" {
				continue
			}
			pinned := s.Spec.LoadBalancerIP == ing.IP || s.Annotations[annotationFor(ing.IP)] == ing.IP
			out = append(out, azure.ServiceAddress{Namespace: s.Namespace, Name: s.Name, IP: ing.IP, Internal: s.Annotations[InternalAnnotation] == "true", Pinned: pinned,
				UID: string(s.UID), Subnet: s.Annotations[InternalSubnetAnnotation], DualStack: len(s.Spec.IPFamilies) == 2})
		}
	}
	return out, nil
}

func annotationFor(ip string) string {
	if addr, err := netip.ParseAddr(ip); err == nil && addr.Unmap().Is6() {
		return IPv6Annotation
	}
	return IPv4Annotation
}

// pin makes a Service ask cloud-provider-azure for the address it has.
func pin(ctx context.Context, kube kubernetes.Interface, s azure.ServiceAddress) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationFor(s.IP): s.IP}}})
	if err != nil {
		return err
	}
	if _, err := kube.CoreV1().Services(s.Namespace).Patch(ctx, s.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("pinning Service %s/%s to %s: %w", s.Namespace, s.Name, s.IP, err)
	}
	return nil
}
