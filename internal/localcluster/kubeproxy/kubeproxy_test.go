package kubeproxy

import (
	"strings"
	"testing"
	"time"
)

// A minSyncPeriod of 0 would be read by kube-proxy as unset and defaulted
// to 1 s, so the configuration always says what kube-proxy will do.
func TestConfigMinSyncPeriod(t *testing.T) {
	tests := []struct {
		name string
		set  time.Duration
		want string
	}{
		{name: "unset is upstream's default, written out", want: "  minSyncPeriod: 1s\n"},
		{name: "a shorter period", set: 10 * time.Millisecond, want: "  minSyncPeriod: 10ms\n"},
		{name: "a negative period is the default", set: -time.Second, want: "  minSyncPeriod: 1s\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := config(Node{Name: "node-1", ClusterCIDRs: []string{"10.244.0.0/16"}, MinSyncPeriod: tt.set}, "/kubeconfig")
			if !strings.Contains(got, tt.want) {
				t.Fatalf("configuration lacks %q:\n%s", tt.want, got)
			}
		})
	}
}
