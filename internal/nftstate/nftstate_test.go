package nftstate

import (
	"os"
	"testing"

	"github.com/google/nftables"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Rules and Elements count what is there: a gone table has no rules, and
// its set is an error.
func TestRulesAndElementsCountWhatIsThere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: a network namespace and nftables (make test runs as root)")
	}
	h, err := network.NewHost("nftstate")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c, err := Conn(h.NetNS())
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Name: "t", Family: nftables.TableFamilyIPv4}
	set := &nftables.Set{Name: "s", Table: tbl, KeyType: nftables.TypeIPAddr}
	rules := func(what string, want int) {
		t.Helper()
		if n, err := Rules(c, tbl, "c"); err != nil || n != want {
			t.Errorf("%s: Rules = %d, %v; want %d, nil", what, n, err, want)
		}
	}
	elements := func(what string, want int) {
		t.Helper()
		if n, err := Elements(c, set); err != nil || n != want {
			t.Errorf("%s: Elements = %d, %v; want %d, nil", what, n, err, want)
		}
	}
	rules("no table", 0)
	if _, err := Elements(c, set); err == nil {
		t.Error("no table: Elements gave no error")
	}
	c.AddTable(tbl)
	chain := c.AddChain(&nftables.Chain{Name: "c", Table: tbl})
	if err := c.AddSet(set, []nftables.SetElement{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}}}); err != nil {
		t.Fatal(err)
	}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: chain})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	rules("installed", 1)
	elements("installed", 2)
	c.FlushChain(chain)
	c.FlushSet(set)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	rules("flushed", 0)
	elements("flushed", 0)
}
