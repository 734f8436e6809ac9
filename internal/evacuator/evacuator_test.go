package evacuator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestRegistered(t *testing.T) {
	many := map[string]string{}
	for i := range 20 {
		many[v1alpha1.EvacuatorAnnotationPrefix+fmt.Sprintf("c%02d", i)] = fmt.Sprint(i)
	}
	var top []v1alpha1.Evacuator
	for i := 19; i >= 20-v1alpha1.MaxEvacuators; i-- {
		top = append(top, v1alpha1.Evacuator{EvacuatorClass: fmt.Sprintf("c%02d", i), Priority: int32(i)})
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        []v1alpha1.Evacuator
	}{
		{"none", map[string]string{"other": "1"}, nil},
		{"highest first, then by class", map[string]string{
			v1alpha1.EvacuatorAnnotationPrefix + "b": "10/controller",
			v1alpha1.EvacuatorAnnotationPrefix + "a": "10",
			v1alpha1.EvacuatorAnnotationPrefix + "z": "-2147483648",
			v1alpha1.EvacuatorAnnotationPrefix + "y": "2147483647/x",
		}, []v1alpha1.Evacuator{
			{EvacuatorClass: "y", Priority: 2147483647, Role: "x"},
			{EvacuatorClass: "a", Priority: 10},
			{EvacuatorClass: "b", Priority: 10, Role: "controller"},
			{EvacuatorClass: "z", Priority: -2147483648},
		}},
		{"malformed ones skipped", map[string]string{
			v1alpha1.EvacuatorAnnotationPrefix:              "1",
			v1alpha1.EvacuatorAnnotationPrefix + "big":      "2147483648",
			v1alpha1.EvacuatorAnnotationPrefix + "word":     "high",
			v1alpha1.EvacuatorAnnotationPrefix + "longrole": "1/" + strings.Repeat("r", 64),
			v1alpha1.EvacuatorAnnotationPrefix + "ok":       "1/controller",
		}, []v1alpha1.Evacuator{{EvacuatorClass: "ok", Priority: 1, Role: "controller"}}},
		{"only the highest MaxEvacuators", many, top},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Registered(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Registered (-want +got):\n%s", diff)
			}
		})
	}
}
