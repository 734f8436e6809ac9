package controller

import (
	"testing"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// With --cloud azure the spot taint is the design's
// cloudprovider.azure.microsoft.com/draining, unless the flag was given.
func TestCloudDefaults(t *testing.T) {
	for _, tt := range []struct {
		name, cloud, flag string
		changed           bool
		want              string
	}{
		{"no cloud: ebb's own key", "", lbmodel.TaintDraining, false, lbmodel.TaintDraining},
		{"azure: the design's key", "azure", lbmodel.TaintDraining, false, lbmodel.TaintAzureDraining},
		{"azure, key given", "azure", "example.com/spot", true, "example.com/spot"},
		{"azure, turned off", "azure", "", true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &Options{Cloud: tt.cloud, SpotTaintKey: tt.flag}
			o.cloudDefaults(func(string) bool { return tt.changed })
			if o.SpotTaintKey != tt.want {
				t.Errorf("spot taint key %q, want %q", o.SpotTaintKey, tt.want)
			}
		})
	}
}
