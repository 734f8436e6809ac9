package lbmodel

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIsLeaving(t *testing.T) {
	taint := func(key, value string) corev1.Taint {
		return corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule}
	}
	node := func(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	retiring := []LeavingSignal{
		{Kind: SignalLabel, Key: "example.com/retiring", Value: "true"},
		{Kind: SignalTaint, Key: "example.com/upgrade"},
	}
	tests := []struct {
		name       string
		node       *corev1.Node
		opts       Options
		wantReason string // "" means not leaving
	}{
		{"no signal", node(nil), Options{}, ""},
		{"cordon alone", &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{taint("node.kubernetes.io/unschedulable", "")}}}, Options{}, ""},
		{"a NodeMaintenance", node(nil, taint(TaintDraining, "")), Options{}, TaintDraining},
		{"out of service", node(nil, taint(TaintOutOfService, "nodeshutdown")), Options{}, TaintOutOfService},
		{"spot eviction", node(nil, taint(TaintAzureDraining, SpotEvictionValue)), Options{}, TaintAzureDraining},
		{"Azure's key with another value", node(nil, taint(TaintAzureDraining, "other")), Options{}, ""},
		{"the autoscaler", node(nil, taint(TaintToBeDeleted, "1732233600")), Options{}, TaintToBeDeleted},
		{"the autoscaler ignored", node(nil, taint(TaintToBeDeleted, "1732233600")), Options{IgnoreAutoscalerTaint: true}, ""},
		{"Karpenter", node(nil, taint(TaintKarpenterDisrupted, "")), Options{}, TaintKarpenterDisrupted},
		{"medik8s", node(nil, taint(TaintMedik8sDrain, "")), Options{}, TaintMedik8sDrain},
		{"a configured label", node(map[string]string{"example.com/retiring": "true"}), Options{LeavingSignals: retiring}, "example.com/retiring"},
		{"a configured label, other value", node(map[string]string{"example.com/retiring": "no"}), Options{LeavingSignals: retiring}, ""},
		{"a configured taint, any value", node(nil, taint("example.com/upgrade", "v2")), Options{LeavingSignals: retiring}, "example.com/upgrade"},
		{"a default left out of the configuration", node(nil, taint(TaintKarpenterDisrupted, "")), Options{LeavingSignals: retiring}, ""},
		{"ebb's own taint with an empty configuration", node(nil, taint(TaintDraining, "")), Options{LeavingSignals: []LeavingSignal{}}, TaintDraining},
		{"no configured signal", node(nil, taint(TaintOutOfService, "")), Options{LeavingSignals: []LeavingSignal{}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaving, reason := IsLeaving(tt.node, tt.opts)
			if leaving != (tt.wantReason != "") || reason != tt.wantReason {
				t.Errorf("IsLeaving = %v %q, want reason %q", leaving, reason, tt.wantReason)
			}
		})
	}
}

func TestParseLeavingSignals(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    []LeavingSignal
		wantErr string
	}{
		{name: "empty", text: "", want: []LeavingSignal{}},
		{name: "comments and blanks", text: "# none\n\n   \n", want: []LeavingSignal{}},
		{name: "every form", text: "taint:karpenter.sh/disrupted\n  taint:cloudprovider.azure.microsoft.com/draining=spot-eviction \nlabel:example.com/retiring\nlabel:retiring=true\n", want: []LeavingSignal{
			{Kind: SignalTaint, Key: TaintKarpenterDisrupted},
			{Kind: SignalTaint, Key: TaintAzureDraining, Value: SpotEvictionValue},
			{Kind: SignalLabel, Key: "example.com/retiring"},
			{Kind: SignalLabel, Key: "retiring", Value: "true"},
		}},
		{name: "no kind", text: "karpenter.sh/disrupted", wantErr: `line 1 ("karpenter.sh/disrupted"): no kind: write taint:KEY`},
		{name: "unknown kind", text: "\nannotation:a", wantErr: `line 2 ("annotation:a"): kind "annotation" is neither taint nor label`},
		{name: "bad key", text: "taint:-bad", wantErr: `key "-bad"`},
		{name: "empty key", text: "label:", wantErr: `key ""`},
		{name: "bad value", text: "label:a=b c", wantErr: `value "b c"`},
		{name: "empty value", text: "label:a=", wantErr: "leave out '=' to match any value"},
		{name: "cordon", text: "taint:node.kubernetes.io/unschedulable", wantErr: "cordon alone never makes a node leaving"},
		{name: "repeated", text: "taint:a\n# x\ntaint:a", want: []LeavingSignal{{Kind: SignalTaint, Key: "a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLeavingSignals(tt.text)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// The defaults, written out as a configuration, read back the same: what
// config/ ships and the flag's help text say is what counts.
func TestDefaultLeavingSignalsRoundTrip(t *testing.T) {
	var b strings.Builder
	for _, s := range DefaultLeavingSignals() {
		b.WriteString(s.String() + "\n")
	}
	got, err := ParseLeavingSignals(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := DefaultLeavingSignals(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
