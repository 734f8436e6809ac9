package localcluster

import (
	"context"
	"fmt"
	"os"
	"time"
)

// TestingM is the part of *testing.M that RunTests uses.
type TestingM interface{ Run() int }

// RunTests is a test package's TestMain body: it re-executes the test binary
// in a private namespace, starts a cluster there with opts, stores it in
// *cluster, runs the tests and stops the cluster. It returns the exit code.
//
//	func TestMain(m *testing.M) { os.Exit(localcluster.RunTests(m, localcluster.Options{}, &cluster)) }
func RunTests(m TestingM, opts Options, cluster **Cluster) int {
	if !InNamespace() {
		code, err := Reexec()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return code
	}
	if err := SetupNamespace(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	c, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the local cluster: %v\n", err)
		return 1
	}
	*cluster = c
	code := m.Run()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the local cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
