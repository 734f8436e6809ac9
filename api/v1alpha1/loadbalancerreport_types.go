package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AdminState is a node's admin state on a load balancer (seed 000):
// None, in rotation (the probes decide), or Down, no new connections.
// +kubebuilder:validation:Enum=None;Down
type AdminState string

// Admin states.
const (
	AdminStateNone AdminState = "None"
	AdminStateDown AdminState = "Down"
)

// NodeTraffic is what one load balancer replica sends through one node.
type NodeTraffic struct {
	// Name of the node.
	Name string `json:"name"`
	// AdminState of the node's backends on this replica.
	AdminState AdminState `json:"adminState"`
	// Connections counts the established TCP connections and live UDP
	// flows this replica has through the node's backends (and the pods
	// on it, in pod mode).
	Connections int64 `json:"connections"`
}

// LoadBalancerReportStatus is one replica's report.
type LoadBalancerReportStatus struct {
	// Replica is the reporting `ebb lb` (its host or pod name).
	Replica string `json:"replica,omitempty"`
	// HostNode is the node the replica runs on (its LB host), when known.
	// NodeMaintenance of that node waits for Draining and for the
	// replica's own Connections to end.
	// +optional
	HostNode string `json:"hostNode,omitempty"`
	// Draining: the replica takes no new connections on purpose: its
	// host is leaving (it withdrew its announcements), or it handed its
	// sockets to a successor. Its established connections continue, and
	// Connections counts them down.
	// +optional
	Draining bool `json:"draining,omitempty"`
	// Joining: the replica started announcing a short while ago (its
	// first start on the host, or its host came back from leaving), at
	// JoinTime. The routers then move some of the other hosts' established
	// connections to it, and it forwards their segments back to the hosts
	// that joined before it (never to one that joined later, so no segment
	// goes around in circles).
	// +optional
	Joining bool `json:"joining,omitempty"`
	// +optional
	JoinTime *metav1.Time `json:"joinTime,omitempty"`
	// RenewTime is when the report was last written; a report older than
	// a few heartbeats is from a replica that is gone and is ignored.
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// HeartbeatSeconds is how often the replica renews the report.
	HeartbeatSeconds int32 `json:"heartbeatSeconds,omitempty"`
	// NodeCount, LeavingNodes (admin Down) and Connections (over all
	// nodes) summarize Nodes for `kubectl get`.
	NodeCount    int32 `json:"nodeCount,omitempty"`
	LeavingNodes int32 `json:"leavingNodes,omitempty"`
	Connections  int64 `json:"connections,omitempty"`
	// Nodes with backends on this replica, sorted by name.
	// +listType=map
	// +listMapKey=name
	// +optional
	Nodes []NodeTraffic `json:"nodes,omitempty"`
	// Announcement says how the replica announces the addresses it
	// serves, as it does now; absent: it announces nothing itself.
	// +optional
	Announcement *Announcement `json:"announcement,omitempty"`
	// Served are the Service addresses this replica takes traffic for
	// now, sorted: a frontend on the address is open, the address is
	// local to the host, and the replica announces it where an
	// AnnouncementPolicy says to announce it (by BGP to an established
	// session; by L2 only on the address's owner). The controller
	// publishes a Service's address in its status once one replica that
	// is not draining serves it, so that a client never connects before
	// anything takes its traffic. Empty while the replica is draining.
	// +optional
	// +listType=set
	Served []string `json:"served,omitempty"`
}

// Announcement is what one replica tells the network.
type Announcement struct {
	// L2Owned are the addresses this replica owns on its segment: it
	// answers ARP and NDP for them (ebb lb --l2-interface), sorted.
	// +optional
	L2Owned []string `json:"l2Owned,omitempty"`
	// BGPAnnounced are the addresses it announces to its BGP peers,
	// sorted.
	// +optional
	BGPAnnounced []string `json:"bgpAnnounced,omitempty"`
	// BGPPeers are its BGP sessions.
	// +optional
	// +listType=map
	// +listMapKey=address
	BGPPeers []BGPSession `json:"bgpPeers,omitempty"`
}

// BGPSession is one BGP session of a replica.
type BGPSession struct {
	// Address of the peer.
	Address string `json:"address"`
	// State of the session: established, active, idle, connect, opensent,
	// openconfirm; or error, when a BGPPeer chooses this host but cannot be
	// peered with (Message says why).
	State string `json:"state"`
	// Message says why the session cannot be opened.
	// +optional
	Message string `json:"message,omitempty"`
}

// LoadBalancerReport is written by each `ebb lb` replica: per node, the
// admin state it applies and how many established connections still go
// through the node. NodeMaintenance reads them to drain traffic before
// pods, and to know when a node carries no more traffic.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbr
// +kubebuilder:printcolumn:name="Replica",type=string,JSONPath=`.status.replica`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.hostNode`
// +kubebuilder:printcolumn:name="Draining",type=boolean,JSONPath=`.status.draining`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodeCount`
// +kubebuilder:printcolumn:name="Leaving",type=integer,JSONPath=`.status.leavingNodes`
// +kubebuilder:printcolumn:name="Connections",type=integer,JSONPath=`.status.connections`
// +kubebuilder:printcolumn:name="L2 owned",type=string,JSONPath=`.status.announcement.l2Owned`
// +kubebuilder:printcolumn:name="BGP peers",type=string,JSONPath=`.status.announcement.bgpPeers[*].state`,priority=1
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.status.renewTime`
type LoadBalancerReport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status LoadBalancerReportStatus `json:"status,omitempty"`
}

// LoadBalancerReportList is a list of LoadBalancerReports.
// +kubebuilder:object:root=true
type LoadBalancerReportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LoadBalancerReport `json:"items"`
}

// Fresh reports whether the report was renewed within three heartbeats.
func (r *LoadBalancerReport) Fresh(now metav1.Time) bool {
	if r.Status.RenewTime == nil {
		return false
	}
	hb := r.Status.HeartbeatSeconds
	if hb <= 0 {
		hb = 10
	}
	return now.Sub(r.Status.RenewTime.Time).Seconds() <= float64(3*hb)
}
