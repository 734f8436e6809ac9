// Package ebbrun installs ebb on a local cluster (internal/localcluster)
// as a user does, from dist/install.yaml, as pods of its own image
// (InstallManifest, InstallOnNode), changes the installed workloads as a
// user's kubectl would (UpdateLBArgs, ScaleController, ...), and reads
// their pages where they run (LBPage, ControllerPage). The e2e suites, the
// benchmarks, the demo and `ebb cluster up` use it.
package ebbrun
