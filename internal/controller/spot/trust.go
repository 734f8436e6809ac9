package spot

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultTrustedSources are the emitters whose PreemptScheduled Events
// ebb acts on unless told otherwise (--spot-event-sources):
// node-problem-detector's custom plugin monitor, which emits them on AKS
// from the VM's scheduled events, and node-problem-detector under its own
// name.
var DefaultTrustedSources = []string{"custom-plugin-monitor", "node-problem-detector"}

// trustedNamespaces are where an Event about a Node can be written only by
// those who may write about the cluster: the API server accepts an Event
// about a cluster-scoped object in `default` (and `kube-system` for the
// events.k8s.io API) only, and a namespace user's role does not reach
// either.
var trustedNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem}

// Refusal reasons, as the metric's result label and the Event's note say.
const (
	refusedNamespace   = "refused-namespace"
	refusedSource      = "refused-source"
	refusedEarlierNode = "refused-earlier-node"
)

// untrusted says why ev cannot be taken as a preemption signal about a
// Node, or returns "" when it can. A namespace editor may write Events
// into their own namespace, and the API server only checks that an
// Event's involvedObject.namespace is its own: an Event that names a Node
// with a namespace, or that lives outside the trusted namespaces, was
// written by someone with no say over nodes. The emitter must also be one
// the operator trusts: source.component for core Events,
// reportingController for events.k8s.io ones.
func untrusted(ev *corev1.Event, sources []string) (result, why string) {
	switch {
	case ev.InvolvedObject.Namespace != "":
		return refusedNamespace, fmt.Sprintf("it names the Node within namespace %q, as only an Event written by a namespace user does (a Node belongs to no namespace)", ev.InvolvedObject.Namespace)
	case !slices.Contains(trustedNamespaces, ev.Namespace):
		return refusedNamespace, fmt.Sprintf("it was written in namespace %q; an Event about a Node is trusted in %s only", ev.Namespace, strings.Join(trustedNamespaces, " or "))
	case !slices.Contains(sources, ev.Source.Component) && !slices.Contains(sources, ev.ReportingController):
		return refusedSource, fmt.Sprintf("its emitter (source %q, reporting controller %q) is not one of the trusted sources %s (ebb controller --spot-event-sources)",
			ev.Source.Component, ev.ReportingController, strings.Join(sources, ", "))
	}
	return "", ""
}

// aboutEarlierNode reports whether ev is about an earlier node of node's
// name rather than node itself. The emitters differ in what they put in
// involvedObject.uid: node-problem-detector and kubelet write the node's
// name there, others the Node's UID, some nothing. A UID that is the
// Node's settles it; otherwise an Event the API server created before the
// Node was (both to the second, as the API keeps them) is about an
// earlier one.
func aboutEarlierNode(ev *corev1.Event, node *corev1.Node) bool {
	switch uid := string(ev.InvolvedObject.UID); {
	case uid == string(node.UID):
		return false
	case uid != "" && uid != node.Name:
		return true // another Node's UID
	}
	return ev.CreationTimestamp.Time.Truncate(time.Second).Before(node.CreationTimestamp.Time.Truncate(time.Second))
}
