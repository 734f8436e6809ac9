package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BGPPeerSpec is one router that the LB hosts open a BGP session with, to
// announce the load-balancer addresses they serve.
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveTime) || !has(self.holdTime) || duration(self.keepaliveTime) < duration(self.holdTime)",message="keepaliveTime must be shorter than holdTime (a third of it is usual)"
type BGPPeerSpec struct {
	// PeerAddress is the router's address, IPv4 or IPv6, reachable from
	// the LB hosts.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="peerAddress must be an IP address like 10.0.0.253 or fd00::fe"
	PeerAddress string `json:"peerAddress"`

	// PeerASN is the router's AS number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	PeerASN int64 `json:"peerASN"`

	// MyASN is the LB hosts' AS number on this session (equal to PeerASN:
	// iBGP; different: eBGP).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	MyASN int64 `json:"myASN"`

	// PeerPort is the router's BGP port (default 179).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	PeerPort int32 `json:"peerPort,omitempty"`

	// HoldTime offered to the router (default 90s; the router may ask for
	// less). It bounds how long a host that died without withdrawing keeps
	// receiving new flows: 3s is the shortest RFC 4271 allows.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) == duration('0s') || (duration(self) >= duration('3s') && duration(self) <= duration('65535s'))",message="holdTime must be 0s or between 3s and 65535s (RFC 4271)"
	HoldTime *metav1.Duration `json:"holdTime,omitempty"`

	// KeepaliveTime between messages (default a third of HoldTime).
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="keepaliveTime must be at least 1s"
	KeepaliveTime *metav1.Duration `json:"keepaliveTime,omitempty"`

	// PasswordSecretRef names a Secret in the namespace of ebb lb (usually
	// ebb-system), labeled lb.ebb.dev/bgp-password=true, whose key
	// "password" is the session's TCP MD5 password (RFC 2385), as the
	// router is configured with it. A missing Secret or key keeps the
	// session closed and says so in the peer's status.
	// +optional
	PasswordSecretRef *SecretReference `json:"passwordSecretRef,omitempty"`

	// GracefulRestart negotiates graceful restart (RFC 4724; default
	// true): when an ebb lb process hands its host over to a new one (a
	// rolling upgrade), the router keeps the host's routes while the new
	// process opens the session again, instead of moving the flows away
	// and back. The restart time is ebb lb's --bgp-graceful-restart-time.
	// +optional
	// +kubebuilder:default=true
	GracefulRestart *bool `json:"gracefulRestart,omitempty"`

	// NodeSelector chooses the LB hosts that peer with this router (empty
	// or absent: every host running ebb lb).
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// SecretReference names a Secret in ebb lb's namespace.
type SecretReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// BGPSessionStatus is the session of one LB host with the peer.
type BGPSessionStatus struct {
	// Node is the LB host.
	Node string `json:"node"`
	// State is the BGP state (RFC 4271's finite-state machine, as ebb lb
	// reports it): established, active, connect, opensent, openconfirm,
	// idle; or "configuring" while the host has not opened the session
	// yet, and "error" with Message when it cannot.
	State string `json:"state"`
	// Message says why a session cannot be opened.
	// +optional
	Message string `json:"message,omitempty"`
}

// BGPPeerStatus is what the LB hosts' sessions with the peer are now,
// gathered from their LoadBalancerReports by ebb controller.
type BGPPeerStatus struct {
	// Sessions lists one entry per LB host the nodeSelector chooses that
	// runs ebb lb, sorted by node.
	// +optional
	// +listType=map
	// +listMapKey=node
	Sessions []BGPSessionStatus `json:"sessions,omitempty"`
	// Established counts the sessions that are established, of Selected.
	// +optional
	// +kubebuilder:default=0
	Established int32 `json:"established"`
	// +optional
	// +kubebuilder:default=0
	Selected int32 `json:"selected"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Established (True when every selected host's session is
	// established; False with reason SessionsDown, NoHosts or
	// InvalidSelector).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BGPPeer is a router that LB hosts announce load-balancer addresses to.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=bgppeer
// +kubebuilder:printcolumn:name="Peer",type=string,JSONPath=`.spec.peerAddress`
// +kubebuilder:printcolumn:name="Peer ASN",type=integer,JSONPath=`.spec.peerASN`
// +kubebuilder:printcolumn:name="My ASN",type=integer,JSONPath=`.spec.myASN`
// +kubebuilder:printcolumn:name="Established",type=integer,JSONPath=`.status.established`
// +kubebuilder:printcolumn:name="Hosts",type=integer,JSONPath=`.status.selected`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPPeerSpec   `json:"spec"`
	Status BGPPeerStatus `json:"status,omitempty"`
}

// BGPPeerList is a list of BGPPeers.
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPPeer `json:"items"`
}

// PasswordKey is the key of a BGPPeer's password Secret.
const PasswordKey = "password"

// PasswordSecretLabel, with the value "true", marks the Secrets that hold
// BGP passwords: ebb lb caches and watches only those, not every Secret of
// its namespace (the webhook's CA key, a cloud credential).
const PasswordSecretLabel = "lb.ebb.dev/bgp-password"

// Condition types and reasons of a BGPPeer.
const (
	// EstablishedCondition: every selected LB host has its session
	// established.
	EstablishedCondition = "Established"
	// ReasonAllEstablished, ReasonSessionsDown and ReasonNoHosts are
	// Established's reasons.
	ReasonAllEstablished = "AllEstablished"
	ReasonSessionsDown   = "SessionsDown"
	ReasonNoHosts        = "NoHosts"
)

// Session states besides BGP's own, as BGPSessionStatus.State.
const (
	// SessionConfiguring: the host has not opened the session yet.
	SessionConfiguring = "configuring"
	// SessionError: the host cannot open the session (Message says why).
	SessionError = "error"
)
