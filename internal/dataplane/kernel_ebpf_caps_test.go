package dataplane

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/cilium/ebpf"
)

// loadOnlyEnv makes TestEBPFProgramLoadsWithCAPBPFAlone, run again by
// itself under reduced capabilities, load the program and nothing else.
const loadOnlyEnv = "EBB_TEST_EBPF_LOAD_ONLY"

// The eBPF path's programs pass the verifier of a process with CAP_BPF
// and CAP_NET_ADMIN alone, as ebb lb's pod has them (config/components/
// kernel-ebpf): without CAP_PERFMON the verifier is stricter, and a
// program the tests' root loads may be refused there (seen: "attempt to
// corrupt spilled pointer on stack", every kernel e2e test failing).
func TestEBPFProgramLoadsWithCAPBPFAlone(t *testing.T) {
	if os.Getenv(loadOnlyEnv) == "1" {
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(ebpfObject))
		if err != nil {
			t.Fatal(err)
		}
		coll, err := ebpf.NewCollection(spec)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		coll.Close()
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to run itself again with CAP_BPF and CAP_NET_ADMIN alone")
	}
	cmd := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+bpf,+net_admin", "--",
		os.Args[0], "-test.run=^TestEBPFProgramLoadsWithCAPBPFAlone$", "-test.count=1")
	cmd.Env = append(os.Environ(), loadOnlyEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("loading the programs with CAP_BPF and CAP_NET_ADMIN alone: %v\n%s", err, out)
	}
}
