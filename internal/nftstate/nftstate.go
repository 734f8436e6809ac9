// Package nftstate holds what ebb's nftables owners (the address guard,
// the forwarding of moved flows, the ARP rules, the kernel engine) share
// to reach their tables and to tell whether a table is still as they left
// it: a firewall reload (`nft flush ruleset`) removes tables, chains and
// set elements without telling anyone.
package nftstate

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Conn opens nftables in the network namespace netns (a file descriptor;
// 0: this process's).
func Conn(netns int) (*nftables.Conn, error) {
	if netns != 0 {
		return nftables.New(nftables.WithNetNSFd(netns))
	}
	return nftables.New()
}

// Rules returns how many rules chain of t has. A table or chain that is
// gone has none (the kernel answers an empty list, or ENOENT), so compare
// with a count above zero to tell that it is gone.
func Rules(c *nftables.Conn, t *nftables.Table, chain string) (int, error) {
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading chain %s of table %s: %w", chain, t.Name, err)
	}
	return len(rules), nil
}

// Elements returns how many elements set has. A set that is gone is an
// error (the library does not let ENOENT through): check the table's
// rules first.
func Elements(c *nftables.Conn, set *nftables.Set) (int, error) {
	elems, err := c.GetSetElements(set)
	if err != nil {
		return 0, fmt.Errorf("reading set %s of table %s: %w", set.Name, set.Table.Name, err)
	}
	return len(elems), nil
}
