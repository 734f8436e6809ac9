// Command ebb is ebb's single binary; see `ebb --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/cmd/root"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.NewCommand().ExecuteContext(ctx)
	stop()
	var exit *cluster.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.Code)
	case err != nil:
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
