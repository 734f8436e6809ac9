// Package ebbrun runs ebb on a local cluster (internal/localcluster): as
// processes in the cluster's namespace (StartEbb, StartController,
// StartLB, with ebb's API installed by InstallAPI), or installed from its
// own manifests as pods (InstallManifest, WaitInstalled). The e2e suites,
// the benchmarks, the demo and `ebb cluster up` use it.
package ebbrun
