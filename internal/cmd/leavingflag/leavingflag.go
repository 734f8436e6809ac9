// Package leavingflag is the --leaving-signals-file flag that the
// controller, ebb lb and the node-agent share, so that one configuration
// (config/ mounts the ConfigMap ebb-leaving-signals into all three) means
// the same list everywhere.
package leavingflag

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/pflag"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Name is the flag's name.
const Name = "leaving-signals-file"

// file is the flag's value: reading and checking happen when the flag is
// set, so a bad file stops the process at start with the line at fault,
// before it serves anything.
type file struct {
	path string
	dst  *[]lbmodel.LeavingSignal
}

func (f *file) String() string { return f.path }
func (f *file) Type() string   { return "file" }

func (f *file) Set(path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// The ConfigMap is mounted optional: deleted, the defaults rule
		// (nil), rather than no pod of ebb starting.
		f.path, *f.dst = path, nil
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the leaving signals: %w", err)
	}
	signals, err := lbmodel.ParseLeavingSignals(string(data))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	f.path, *f.dst = path, signals
	return nil
}

// Add registers --leaving-signals-file on fs, filling dst when it is set;
// dst stays nil (lbmodel's defaults) otherwise.
func Add(flags *pflag.FlagSet, dst *[]lbmodel.LeavingSignal) {
	flags.Var(&file{dst: dst}, Name, "file of the taints and labels that make a node leaving, one per line: taint:KEY, taint:KEY=VALUE, label:KEY or label:KEY=VALUE; # starts a comment; a missing file means the default list (default: "+defaults()+"; ebb.dev/draining always counts; docs/nodes-that-leave.md). Give every ebb component the same file")
}

func defaults() string {
	s := ""
	for i, sig := range lbmodel.DefaultLeavingSignals() {
		if i > 0 {
			s += ", "
		}
		s += sig.String()
	}
	return s
}
