package install_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The examples a user starts from (config/samples) are accepted by the
// installed API as they are: the CRDs' validation and ebb's admission
// webhooks (a server-side dry run, which runs both and stores nothing).
func TestSamplesAreAccepted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	samples, err := filepath.Abs(filepath.Join("..", "..", "..", "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(samples, "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("samples %v (%v): want the AddressPool, BGPPeer, AnnouncementPolicy and NodeMaintenance ones at least", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The maintenance sample drains node-1, this suite's only LB host,
		// which admission rightly refuses (it would leave no ebb lb
		// serving): it drains a node that is not one here.
		manifest := strings.ReplaceAll(string(data), "values: [node-1]", "values: ["+otherNode()+"]")
		kubectl := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig,
			"apply", "--dry-run=server", "-f", "-")
		kubectl.Stdin = strings.NewReader(manifest)
		out, err := kubectl.CombinedOutput()
		if err != nil {
			t.Errorf("kubectl apply --dry-run=server -f %s: %v\n%s", filepath.Base(f), err, out)
			continue
		}
		t.Logf("%s: %s", filepath.Base(f), strings.TrimSpace(string(out)))
	}
}

// otherNode is a node of the cluster that is not the LB host.
func otherNode() string {
	for _, n := range cluster.Nodes {
		if n.Name != lbNode {
			return n.Name
		}
	}
	return ""
}
