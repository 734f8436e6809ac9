package network

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// filterVM runs prog as the kernel would once attached: it must assemble
// (what openTap attaches), and the VM runs what the assembly disassembles
// to.
func filterVM(prog []bpf.Instruction) (*bpf.VM, error) {
	filter, err := assemble(prog)
	if err != nil {
		return nil, err
	}
	raw := make([]bpf.RawInstruction, len(filter))
	for i, f := range filter {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		return nil, fmt.Errorf("the filter does not disassemble")
	}
	return bpf.NewVM(insns)
}
