// Package root assembles the ebb command line.
package root

import (
	"github.com/spf13/cobra"

	"github.com/ebbdev/ebb/internal/cmd/azurecmd"
	"github.com/ebbdev/ebb/internal/cmd/controller"
	"github.com/ebbdev/ebb/internal/cmd/lb"
	"github.com/ebbdev/ebb/internal/cmd/nodeagent"
	"github.com/ebbdev/ebb/internal/cmd/uninstall"
	"github.com/ebbdev/ebb/internal/version"
)

// NewCommand returns the ebb root command with the components' subcommands
// and extra ones (the developer tools, which the image leaves out).
func NewCommand(extra ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ebb",
		Short: "ebb drains Kubernetes nodes without dropping a request",
		Long: `ebb drains Kubernetes nodes without dropping a request: a Service
type=LoadBalancer implementation whose backends carry an admin state, and
declarative node maintenance that drains the load balancer before the pods.`,
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(azurecmd.NewCommand(), controller.NewCommand(), lb.NewCommand(), nodeagent.NewCommand(), uninstall.NewCommand())
	cmd.AddCommand(extra...)
	return cmd
}
