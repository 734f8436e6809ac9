// Package kubectlmaintenance implements the `kubectl maintenance` plugin:
// drain (create a NodeMaintenance), status (progress and what blocks it,
// in plain words), complete and list.
package kubectlmaintenance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// options are shared by every subcommand.
type options struct {
	flags  *genericclioptions.ConfigFlags
	out    io.Writer
	errOut io.Writer
	output string
	// now is the clock for ages and "last progress" (tests fix it).
	now func() time.Time
}

// NewCommand returns `kubectl maintenance` with its subcommands.
func NewCommand(out, errOut io.Writer) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), out: out, errOut: errOut, now: time.Now}
	cmd := &cobra.Command{
		Use:           "kubectl-maintenance",
		Short:         "Drain nodes with NodeMaintenance: start, watch, explain and complete maintenances",
		SilenceUsage:  true,
		SilenceErrors: false,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl maintenance"},
	}
	o.flags.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: text)")
	cmd.AddCommand(newDrainCommand(o), newStartCommand(o), newStatusCommand(o), newCompleteCommand(o), newListCommand(o))
	return cmd
}

// client returns a client for the cluster the kubeconfig flags name.
func (o *options) client() (client.Client, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return c, nil
}

// printObject prints obj as JSON or YAML when asked; it reports whether it
// did.
func (o *options) printObject(obj any) (bool, error) {
	switch o.output {
	case "":
		return false, nil
	case "json":
		data, err := json.MarshalIndent(obj, "", "  ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintln(o.out, string(data))
		return true, err
	case "yaml":
		data, err := yaml.Marshal(obj)
		if err != nil {
			return true, err
		}
		_, err = o.out.Write(data)
		return true, err
	default:
		return true, fmt.Errorf("--output %q is not supported: use json or yaml", o.output)
	}
}

func (o *options) get(ctx context.Context, c client.Client, name string) (*v1alpha1.NodeMaintenance, error) {
	nm := &v1alpha1.NodeMaintenance{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, nm); err != nil {
		return nil, fmt.Errorf("reading NodeMaintenance %s: %w", name, err)
	}
	nm.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeMaintenance"))
	return nm, nil
}
