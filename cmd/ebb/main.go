// Command ebb is ebb's single binary; see `ebb --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ebbdev/ebb/internal/cmd/root"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.NewCommand(developerCommands()...).ExecuteContext(ctx)
	stop()
	if code, ok := exitCode(err); ok {
		os.Exit(code)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
