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
//
// Each setup runs after the cluster is ready (to start ebb's components, for
// instance); the cleanups it returns run after the tests, in reverse order.
func RunTests(m TestingM, opts Options, cluster **Cluster, setups ...func(*Cluster) (func(), error)) int {
	if !InNamespace() {
		reexec := Reexec
		if opts.HostUserNamespace || opts.RealKubelets {
			reexec = ReexecInHostUserNamespace
		}
		code, err := reexec()
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
	var cleanups []func()
	code := 0
	for _, setup := range setups {
		cleanup, err := setup(c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "setting up the tests: %v\n", err)
			code = 1
			break
		}
		cleanups = append(cleanups, cleanup)
	}
	if code == 0 {
		code = m.Run()
	}
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the local cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
