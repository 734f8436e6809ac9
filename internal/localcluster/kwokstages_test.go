package localcluster

import (
	"bytes"
	"strings"
	"testing"
)

func TestDualStackPodCreate(t *testing.T) {
	stage := "    statusTemplate: |\n" + string(singleHostIP) + string(singlePodIP) + "      phase: Pending\n"
	tests := []struct {
		name    string
		stage   string
		wantErr bool
	}{
		{name: "kwok's stage", stage: stage},
		{name: "a stage that changed", stage: strings.Replace(stage, "PodIPWith", "PodIPWithSomethingElse", 1), wantErr: true},
		{name: "no pod IP at all", stage: "    statusTemplate: |\n      phase: Pending\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := dualStackPodCreate([]byte(tt.stage))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("rewrote a stage it does not know:\n%s", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"PodIPsWith", "podIPs:", "hostIPs:", "phase: Pending"} {
				if !bytes.Contains(got, []byte(want)) {
					t.Errorf("the rewritten stage has no %q:\n%s", want, got)
				}
			}
			if bytes.Contains(got, singlePodIP) {
				t.Errorf("the rewritten stage still sets a single pod IP:\n%s", got)
			}
		})
	}
}
