package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddressPoolSpec says which addresses a pool holds and which Services may
// draw from it.
type AddressPoolSpec struct {
	// Addresses are CIDRs (10.96.240.0/24, fd00:96::/112) or inclusive
	// ranges (10.96.240.10-10.96.240.20), of either family. In an IPv4
	// CIDR of /24 or larger, the network and broadcast addresses are never
	// handed out.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=90
	// +kubebuilder:validation:XValidation:rule="self.all(a, isCIDR(a) || (a.split('-').size() == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()))",message="each address must be a CIDR like 10.96.240.0/24 or fd00:96::/112, or a range of one family like 10.96.240.10-10.96.240.20"
	Addresses []string `json:"addresses"`

	// AutoAssign: Services that ask for no pool get addresses from this
	// one (default true). False: only Services that name it in the
	// lb.ebb.dev/address-pool annotation, or ask for one of its addresses.
	// +optional
	// +kubebuilder:default=true
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// ServiceSelector limits the pool to Services with these labels
	// (empty or absent: every Service).
	// +optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`

	// NamespaceSelector limits the pool to Services in namespaces with
	// these labels (empty or absent: every namespace).
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// AllowSharingAcrossNamespaces lets Services of different namespaces
	// share one of the pool's addresses when they carry the same
	// lb.ebb.dev/allow-shared-ip value (default false: a sharing key is
	// good within its namespace only, so that a tenant who guesses another
	// namespace's key gets no port on its address).
	// +optional
	AllowSharingAcrossNamespaces bool `json:"allowSharingAcrossNamespaces,omitempty"`
}

// AddressPoolStatus is what the pool holds now.
type AddressPoolStatus struct {
	// AssignedIPv4 and AssignedIPv6 count the pool's addresses held by
	// Services; AvailableIPv4 and AvailableIPv6 the ones still free
	// (capped at 2^63-1). Defaulted to 0, so that a status patch may leave
	// out a count that stays 0.
	// +optional
	// +kubebuilder:default=0
	AssignedIPv4 int64 `json:"assignedIPv4"`
	// +optional
	// +kubebuilder:default=0
	AssignedIPv6 int64 `json:"assignedIPv6"`
	// +optional
	// +kubebuilder:default=0
	AvailableIPv4 int64 `json:"availableIPv4"`
	// +optional
	// +kubebuilder:default=0
	AvailableIPv6 int64 `json:"availableIPv6"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (the pool's addresses are handed out; False with
	// reason InvalidAddresses when the spec cannot be read) and Exhausted
	// (no address left in a family the pool holds).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AddressPool is a set of load-balancer addresses that Services of ebb's
// class are given addresses from.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbpool;lbpools
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Auto",type=boolean,JSONPath=`.spec.autoAssign`
// +kubebuilder:printcolumn:name="IPv4 used",type=integer,JSONPath=`.status.assignedIPv4`
// +kubebuilder:printcolumn:name="IPv4 free",type=integer,JSONPath=`.status.availableIPv4`
// +kubebuilder:printcolumn:name="IPv6 used",type=integer,JSONPath=`.status.assignedIPv6`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AddressPoolSpec   `json:"spec"`
	Status AddressPoolStatus `json:"status,omitempty"`
}

// AddressPoolList is a list of AddressPools.
// +kubebuilder:object:root=true
type AddressPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressPool `json:"items"`
}

// PoolAnnotation on a Service names the AddressPool its addresses come
// from.
const PoolAnnotation = "lb.ebb.dev/address-pool"

// Condition types and reasons of an AddressPool.
const (
	// ReadyCondition: the pool's addresses are handed out.
	ReadyCondition = "Ready"
	// ExhaustedCondition: a family the pool holds has no address left.
	ExhaustedCondition = "Exhausted"
	// ReasonServing: Ready is True.
	ReasonServing = "Serving"
	// ReasonInvalidAddresses: an entry of spec.addresses cannot be read.
	ReasonInvalidAddresses = "InvalidAddresses"
	// ReasonInvalidSelector: a selector cannot be read.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonAddressesLeft and ReasonNoAddressLeft are Exhausted's reasons.
	ReasonAddressesLeft = "AddressesLeft"
	ReasonNoAddressLeft = "NoAddressLeft"
)
