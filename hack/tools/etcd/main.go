// Command etcd is etcd's server main, built from the go.etcd.io/etcd/server/v3
// module pinned in go.mod (etcd's own main module cannot be installed with
// go install because its go.mod has replace lines).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
