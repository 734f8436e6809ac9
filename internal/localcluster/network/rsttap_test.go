package network

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// rstFrame builds an Ethernet frame of an IPv4 TCP segment with flags.
func rstFrame(proto byte, flags byte) []byte {
	f := make([]byte, 14+20+20)
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 7})
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	f[14] = 0x45
	f[14+9] = proto
	copy(f[26:30], []byte{10, 96, 240, 1})
	copy(f[30:34], []byte{10, 1, 0, 2})
	binary.BigEndian.PutUint16(f[34:36], 80)
	binary.BigEndian.PutUint16(f[36:38], 40000)
	f[34+13] = flags
	return f
}

func TestRSTFilterPassesResetsOnly(t *testing.T) {
	vm, err := filterVM(rstFilter())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		frame []byte
		pass  bool
	}{
		{"RST", rstFrame(6, 0x04), true},
		{"RST+ACK", rstFrame(6, 0x14), true},
		{"ACK", rstFrame(6, 0x10), false},
		{"SYN", rstFrame(6, 0x02), false},
		{"UDP", rstFrame(17, 0x04), false},
	} {
		n, err := vm.Run(c.frame)
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) != c.pass {
			t.Errorf("%s: filter returned %d, want pass=%v", c.name, n, c.pass)
		}
	}
	r, ok := parseRST(rstFrame(6, 0x14))
	if !ok || r.Src != netip.MustParseAddrPort("10.96.240.1:80") || r.Dst != netip.MustParseAddrPort("10.1.0.2:40000") || r.From.String() != "02:00:00:00:00:07" {
		t.Errorf("parseRST = %v, %v", r, ok)
	}
}
