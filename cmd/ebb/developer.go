//go:build !ebb_image

package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/cmd/demo"
)

// developerCommands are `ebb cluster` and `ebb demo`, which run a local
// cluster. The image is built with the ebb_image tag and leaves them out:
// they link envtest, whose package initialisation creates a directory
// under $HOME/.cache or /tmp and panics when it cannot, which is every
// container with a read-only root filesystem and no /tmp volume (ebb lb's
// and node-agent's).
func developerCommands() []*cobra.Command {
	return []*cobra.Command{cluster.NewCommand(), demo.NewCommand()}
}

// exitCode is the exit code `ebb cluster exec` passes on.
func exitCode(err error) (int, bool) {
	var exit *cluster.ExitError
	if errors.As(err, &exit) {
		return exit.Code, true
	}
	return 0, false
}
