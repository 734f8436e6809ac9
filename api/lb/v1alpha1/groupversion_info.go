// Package v1alpha1 is ebb's load-balancer API, group lb.ebb.dev: the
// address pools that Services of ebb's class draw their addresses from,
// the BGP peers that the LB hosts announce those addresses to, and the
// policies saying which addresses are announced how, from which hosts.
// +kubebuilder:object:generate=true
// +groupName=lb.ebb.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "lb.ebb.dev", Version: "v1alpha1"}

// SchemeBuilder registers the API's types; AddToScheme adds them to a scheme.
var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &AddressPool{}, &AddressPoolList{}, &BGPPeer{}, &BGPPeerList{}, &AnnouncementPolicy{}, &AnnouncementPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
