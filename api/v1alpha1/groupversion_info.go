// Package v1alpha1 is ebb's node maintenance API, group
// maintenance.ebb.dev: NodeMaintenance and Evacuation after KEP-4212, with
// the KEP's field names.
// +kubebuilder:object:generate=true
// +groupName=maintenance.ebb.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "maintenance.ebb.dev", Version: "v1alpha1"}

// SchemeBuilder registers the API's types; AddToScheme adds them to a scheme.
var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &NodeMaintenance{}, &NodeMaintenanceList{}, &Evacuation{}, &EvacuationList{}, &LoadBalancerReport{}, &LoadBalancerReportList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
