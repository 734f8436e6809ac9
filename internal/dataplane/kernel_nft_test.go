package dataplane

import (
	"os/exec"
	"strings"
	"testing"
)

// An operator reads the kernel engine's tables with the nft tool: the
// whole ruleset, and the maps that say where each slot sends new flows,
// per state of its node. (The tool once aborted on both: it could not tell
// the fields of the maps' keys apart, nor print a lookup keyed by another
// lookup's result.)
func TestKernelEngineTablesReadWithNft(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("this test needs the nft tool (hack/tools.sh installs it): %v", err)
	}
	n := newEngineNet(t, EngineKernel, "IPv4")
	a, _ := n.echo(t, 8080)
	b, _ := n.echo(t, 8081)
	n.apply(t, n.frontendOn(80, a, b))
	if _, err := n.d.SetOwnerAdminState(a.Owner, AdminDown); err != nil {
		t.Fatal(err)
	}
	// nft runs the nft tool in the load balancer's namespace.
	nft := func(args ...string) string {
		t.Helper()
		var out []byte
		err := n.lb.Do(func() (err error) {
			out, err = exec.Command("nft", args...).CombinedOutput()
			return err
		})
		if err != nil {
			t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, m := range []string{"homes", "owners"} {
		if got := nft("list", "map", "ip", DefaultKernelTable, m); !strings.Contains(got, "type mark") {
			t.Errorf("map %s:\n%s\nwant its type printed", m, got)
		}
	}
	backends := nft("list", "map", "ip", DefaultKernelTable, "backends")
	for _, want := range []string{"10.1.0.2 . 8080", "10.1.0.2 . 8081"} {
		if !strings.Contains(backends, want) {
			t.Errorf("map backends:\n%s\nwant an entry for %s", backends, want)
		}
	}
	// The whole ruleset prints too, the pick rule with it.
	if got := nft("list", "ruleset"); !strings.Contains(got, "@backends") {
		t.Errorf("nft list ruleset:\n%s\nwant the pick rule's lookup in @backends", got)
	}
}
