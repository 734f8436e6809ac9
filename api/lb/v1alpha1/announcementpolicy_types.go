package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnouncementPolicySpec says which load-balancer addresses are announced
// how (BGP, L2 or both), and from which LB hosts. While no policy exists,
// every ebb lb announces every address it serves in every way it is set up
// for (BGPPeers or --bgp-peer, --l2-interface); once one exists, an
// address is announced in a way only where a policy says so.
// +kubebuilder:validation:XValidation:rule="has(self.bgp) || has(self.l2)",message="say how the addresses are announced: bgp: {}, l2: {} or both"
// +kubebuilder:validation:XValidation:rule="!has(self.bgp) || (!has(self.bgp.aggregationLength) && !has(self.bgp.aggregationLengthV6)) || (has(self.addressPools) && size(self.addressPools) > 0)",message="bgp.aggregationLength and aggregationLengthV6 need addressPools: an aggregate is announced only where it lies inside the policy's pools"
type AnnouncementPolicySpec struct {
	// AddressPools names the AddressPools whose addresses the policy
	// announces (empty or absent: every address, in a pool or not).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	AddressPools []string `json:"addressPools,omitempty"`

	// NodeSelector chooses the LB hosts that announce them (empty or
	// absent: every host running ebb lb).
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// BGP announces the addresses to the routers the host peers with
	// (BGPPeers that choose it, and its --bgp-peer routers).
	// +optional
	BGP *BGPAnnouncement `json:"bgp,omitempty"`

	// L2 announces the addresses by ARP and NDP, one host owning each.
	// +optional
	L2 *L2Announcement `json:"l2,omitempty"`
}

// BGPAnnouncement is announcement by BGP, and the attributes the routes
// carry. Where several policies announce one address from a host, its
// route carries every community of each and the highest local
// preference.
type BGPAnnouncement struct {
	// Communities are standard communities (RFC 1997) the routes carry,
	// each "ASN:VALUE" with both parts 0 to 65535 (as 64512:100), or a
	// well-known name: no-export, no-advertise, no-export-subconfed,
	// no-peer, graceful-shutdown, blackhole.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=19
	// +kubebuilder:validation:XValidation:rule="self.all(c, c in ['no-export', 'no-advertise', 'no-export-subconfed', 'no-peer', 'graceful-shutdown', 'blackhole'] || (c.matches('^[0-9]{1,5}:[0-9]{1,5}$') && c.split(':').all(p, int(p) <= 65535)))",message="each community is ASN:VALUE with both parts 0 to 65535 (as 64512:100), or no-export, no-advertise, no-export-subconfed, no-peer, graceful-shutdown or blackhole"
	Communities []string `json:"communities,omitempty"`

	// LargeCommunities are large communities (RFC 8092) the routes carry,
	// each "GLOBAL:LOCAL1:LOCAL2" with every part 0 to 4294967295 (as
	// 4200000000:1:2).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.all(c, c.matches('^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$') && c.split(':').all(p, int(p) <= 4294967295))",message="each large community is GLOBAL:LOCAL1:LOCAL2 with every part 0 to 4294967295 (as 4200000000:1:2)"
	LargeCommunities []string `json:"largeCommunities,omitempty"`

	// LocalPreference the routes carry (0 to 4294967295; higher is
	// preferred). Routers take it from iBGP sessions only (a BGPPeer
	// whose myASN equals its peerASN); RFC 4271 keeps it off eBGP
	// sessions, where ebb does not send it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	LocalPreference *int64 `json:"localPreference,omitempty"`

	// AggregationLength announces, for each IPv4 address, the prefix of
	// this length that holds it (one route for all the addresses the host
	// serves in it) instead of its /32 (8 to 32; absent: 32). An aggregate
	// that would reach outside the policy's pools is not announced: those
	// addresses go as /32. Routers then send the host traffic for every
	// address of the prefix, also ones it does not serve (dropped there).
	// +optional
	// +kubebuilder:validation:Minimum=8
	// +kubebuilder:validation:Maximum=32
	AggregationLength *int32 `json:"aggregationLength,omitempty"`

	// AggregationLengthV6 is AggregationLength for IPv6 addresses (16 to
	// 128; absent: 128).
	// +optional
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:validation:Maximum=128
	AggregationLengthV6 *int32 `json:"aggregationLengthV6,omitempty"`
}

// L2Announcement is announcement by ARP and NDP.
type L2Announcement struct {
	// Interfaces limits the announcement to these of the host's L2
	// interfaces (ebb lb --l2-interface; empty or absent: all of them).
	// An interface the host does not announce on is ignored there.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=15
	Interfaces []string `json:"interfaces,omitempty"`
}

// L2Owner is the LB host that answers ARP and NDP for an address.
type L2Owner struct {
	Address string `json:"address"`
	Node    string `json:"node"`
}

// AnnouncementPolicyStatus is what the policy does now.
type AnnouncementPolicyStatus struct {
	// AnnouncedBy says how: BGP, L2 or BGP+L2.
	// +optional
	AnnouncedBy string `json:"announcedBy,omitempty"`
	// Hosts counts the LB hosts the nodeSelector chooses that run ebb lb.
	// +optional
	// +kubebuilder:default=0
	Hosts int32 `json:"hosts"`
	// L2Owners lists, for each address of the policy's pools announced by
	// L2 from its hosts, the host that owns it now, sorted by address.
	// +optional
	// +listType=map
	// +listMapKey=address
	L2Owners []L2Owner `json:"l2Owners,omitempty"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (False with reason PoolNotFound when an
	// addressPools entry names no AddressPool, InvalidSelector, or NoHosts).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AnnouncementPolicy says which load-balancer addresses are announced by
// BGP or L2, from which LB hosts and interfaces.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbannounce
// +kubebuilder:printcolumn:name="Pools",type=string,JSONPath=`.spec.addressPools`
// +kubebuilder:printcolumn:name="By",type=string,JSONPath=`.status.announcedBy`
// +kubebuilder:printcolumn:name="Hosts",type=integer,JSONPath=`.status.hosts`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AnnouncementPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AnnouncementPolicySpec   `json:"spec"`
	Status AnnouncementPolicyStatus `json:"status,omitempty"`
}

// AnnouncementPolicyList is a list of AnnouncementPolicies.
// +kubebuilder:object:root=true
type AnnouncementPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AnnouncementPolicy `json:"items"`
}

// Reasons of an AnnouncementPolicy's Ready condition (besides
// ReasonInvalidSelector and ReasonNoHosts).
const (
	// ReasonAnnouncing: Ready is True.
	ReasonAnnouncing = "Announcing"
	// ReasonPoolNotFound: an addressPools entry names no AddressPool.
	ReasonPoolNotFound = "PoolNotFound"
)
