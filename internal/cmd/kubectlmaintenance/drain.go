package kubectlmaintenance

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func newDrainCommand(o *options) *cobra.Command {
	var selector, reason, planFile, name string
	var cordonOnly, planOnly, watch bool
	cmd := &cobra.Command{
		Use:   "drain (NODE... | -l SELECTOR)",
		Short: "Create a NodeMaintenance that drains (or only cordons) nodes",
		Example: `  kubectl maintenance drain node-1 --reason "kernel upgrade" --watch
  kubectl maintenance drain -l pool=blue --plan plan.yaml
  kubectl maintenance drain node-2 --cordon-only
  kubectl maintenance drain -l pool=green --plan-only --name green-upgrade   # then: kubectl maintenance start green-upgrade`,
		RunE: func(cmd *cobra.Command, nodes []string) error {
			sel, err := nodeSelector(nodes, selector)
			if err != nil {
				return err
			}
			nm := &v1alpha1.NodeMaintenance{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeMaintenance"},
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: sel, Stage: v1alpha1.Drain, Reason: reason},
			}
			if name == "" {
				nm.GenerateName = "maintenance-"
				if len(nodes) == 1 {
					nm.GenerateName = "maintenance-" + nodes[0] + "-"
				}
			}
			switch {
			case planOnly && cordonOnly:
				return errors.New("give --plan-only or --cordon-only, not both: a planned maintenance is started later with 'kubectl maintenance start'")
			case planOnly:
				nm.Spec.Stage = v1alpha1.Idle
			case cordonOnly:
				nm.Spec.Stage = v1alpha1.Cordon
			}
			if planFile != "" {
				data, err := os.ReadFile(planFile)
				if err != nil {
					return fmt.Errorf("reading the drain plan: %w", err)
				}
				if err := yaml.UnmarshalStrict(data, &nm.Spec.DrainPlan); err != nil {
					return fmt.Errorf("%s: a drain plan is a list of {podType, podPriority, podSelector}: %w", planFile, err)
				}
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.Create(cmd.Context(), nm); err != nil {
				return fmt.Errorf("creating the NodeMaintenance: %w", err)
			}
			nm.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeMaintenance"))
			if printed, err := o.printObject(nm); printed || err != nil {
				return err
			}
			fmt.Fprintf(o.out, "nodemaintenance/%s created (stage %s)\n", nm.Name, nm.Spec.Stage)
			if watch {
				return o.status(cmd.Context(), c, nm.Name, true)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes (e.g. pool=blue)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the people who will see it")
	cmd.Flags().StringVar(&planFile, "plan", "", "YAML file with the drain plan entries (the defaults are added)")
	cmd.Flags().StringVar(&name, "name", "", "name of the NodeMaintenance (default: generated)")
	cmd.Flags().BoolVar(&cordonOnly, "cordon-only", false, "only cordon (stage Cordon); drain later with 'kubectl maintenance start NAME'")
	cmd.Flags().BoolVar(&planOnly, "plan-only", false, "only plan it (stage Idle: nothing is touched); start it later with 'kubectl maintenance start NAME'")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "show the progress until the drain finishes")
	return cmd
}

// nodeSelector selects nodes by name (one term each) or by labels.
func nodeSelector(nodes []string, selector string) (*corev1.NodeSelector, error) {
	if (len(nodes) == 0) == (selector == "") {
		return nil, errors.New("give node names or -l SELECTOR (not both)")
	}
	sel := &corev1.NodeSelector{}
	for _, n := range nodes {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}},
		})
	}
	if selector == "" {
		return sel, nil
	}
	parsed, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("-l %q: %w", selector, err)
	}
	reqs, _ := parsed.Requirements()
	var term corev1.NodeSelectorTerm
	for _, r := range reqs {
		var op corev1.NodeSelectorOperator
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			op = corev1.NodeSelectorOpIn
		case selection.NotEquals, selection.NotIn:
			op = corev1.NodeSelectorOpNotIn
		case selection.Exists:
			op = corev1.NodeSelectorOpExists
		case selection.DoesNotExist:
			op = corev1.NodeSelectorOpDoesNotExist
		default:
			return nil, fmt.Errorf("-l %q: operator %s is not supported for nodes", selector, r.Operator())
		}
		term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{Key: r.Key(), Operator: op, Values: r.Values().List()})
	}
	if len(term.MatchExpressions) == 0 {
		return nil, fmt.Errorf("-l %q selects every node: name the nodes or give a real selector", selector)
	}
	sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, term)
	return sel, nil
}

func newCompleteCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "complete NAME",
		Short: "Complete a maintenance: uncordon, untaint and withdraw its Evacuations",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			nm, printed, err := o.moveTo(cmd.Context(), args[0], v1alpha1.Complete)
			if printed || err != nil {
				return err
			}
			fmt.Fprintf(o.out, "nodemaintenance/%s completed: its nodes return to service once no other maintenance holds them\n", nm.Name)
			return nil
		},
	}
}

func newStartCommand(o *options) *cobra.Command {
	var cordonOnly, watch bool
	cmd := &cobra.Command{
		Use:   "start NAME",
		Short: "Start a planned (Idle) or cordoned maintenance: move it to Drain (or Cordon)",
		Example: `  kubectl maintenance start green-upgrade --watch
  kubectl maintenance start green-upgrade --cordon-only`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stage := v1alpha1.Drain
			if cordonOnly {
				stage = v1alpha1.Cordon
			}
			nm, printed, err := o.moveTo(cmd.Context(), args[0], stage)
			if printed || err != nil {
				return err
			}
			fmt.Fprintf(o.out, "nodemaintenance/%s started (stage %s)\n", nm.Name, nm.Spec.Stage)
			if watch && stage == v1alpha1.Drain {
				c, err := o.client()
				if err != nil {
					return err
				}
				return o.status(cmd.Context(), c, nm.Name, true)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cordonOnly, "cordon-only", false, "only cordon (stage Cordon)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "show the progress until the drain finishes")
	return cmd
}

// moveTo moves a maintenance to stage (the apiserver refuses a move
// backwards, saying which moves exist) and prints it when -o asks; printed
// says it did.
func (o *options) moveTo(ctx context.Context, name string, stage v1alpha1.NodeMaintenanceStage) (*v1alpha1.NodeMaintenance, bool, error) {
	c, err := o.client()
	if err != nil {
		return nil, false, err
	}
	nm := &v1alpha1.NodeMaintenance{}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, nm); err != nil {
			return err
		}
		nm.Spec.Stage = stage
		return c.Update(ctx, nm)
	})
	if err != nil {
		return nil, false, fmt.Errorf("moving %s to stage %s: %w", name, stage, err)
	}
	nm.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeMaintenance"))
	printed, err := o.printObject(nm)
	return nm, printed, err
}
