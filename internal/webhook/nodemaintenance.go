// Package webhook is ebb's admission: defaulting and validation of
// NodeMaintenance (KEP-4212's nodemaintenance admission plugin, as a
// webhook), and the serving certificates.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:webhook:path=/mutate-maintenance-ebb-dev-v1alpha1-nodemaintenance,mutating=true,failurePolicy=fail,sideEffects=None,groups=maintenance.ebb.dev,resources=nodemaintenances,verbs=create;update,versions=v1alpha1,name=mnodemaintenance.maintenance.ebb.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-maintenance-ebb-dev-v1alpha1-nodemaintenance,mutating=false,failurePolicy=fail,sideEffects=None,groups=maintenance.ebb.dev,resources=nodemaintenances,verbs=create;update;delete,versions=v1alpha1,name=vnodemaintenance.maintenance.ebb.dev,admissionReviewVersions=v1

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// NodeMaintenance defaults and validates NodeMaintenances.
type NodeMaintenance struct {
	// Client reads nodes and LoadBalancerReports (from a cache) and
	// creates SubjectAccessReviews.
	Client client.Client
	// Now tells the freshness of LoadBalancerReports; default time.Now.
	Now func() time.Time
	// LBNamespace is where ebb lb's DaemonSet runs (lbhost.ListPods:
	// lbhost.DefaultNamespace when empty).
	LBNamespace string
	// Model says which signals make a node leaving (the controller's
	// --leaving-signals-file): a leaving node is no load-balancer host.
	Model lbmodel.Options
}

var nmKind = v1alpha1.GroupVersion.WithKind("NodeMaintenance").GroupKind()

// SetupWithManager registers both webhooks on the manager's server.
func (w *NodeMaintenance) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.NodeMaintenance{}).WithDefaulter(w).WithValidator(w).Complete()
}

// Default adds the drain plan's missing default entries and the Idle
// stage.
func (w *NodeMaintenance) Default(ctx context.Context, nm *v1alpha1.NodeMaintenance) error {
	if nm.Spec.Stage == "" {
		nm.Spec.Stage = v1alpha1.Idle
	}
	// The plan is defaulted once, when it is first set: it is immutable
	// (the CRD's rule). A plan stored without the defaults (the webhook
	// was off) and defaulted again on an update would make every later
	// update refused, the finalizer's removal included, and the
	// maintenance could never be deleted; the controller adds the
	// defaults to such a plan where it reads it.
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Operation == admissionv1.Update && storedPlan(req) {
		return nil
	}
	nm.Spec.DrainPlan = drainplan.WithDefaults(nm.Spec.DrainPlan)
	return nil
}

// storedPlan reports whether the object an update replaces has a drain
// plan; an object that cannot be read as one is taken to have one (the
// plan is then left as the update sends it, which the CRD's rule checks).
func storedPlan(req admission.Request) bool {
	var old v1alpha1.NodeMaintenance
	if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
		return true
	}
	return len(old.Spec.DrainPlan) > 0
}

// ValidateCreate checks the spec, warns when every node is selected, and
// requires that the user may delete every selected node.
func (w *NodeMaintenance) ValidateCreate(ctx context.Context, nm *v1alpha1.NodeMaintenance) (admission.Warnings, error) {
	sel, err := validateSpec(nm)
	if err != nil {
		return nil, err
	}
	nodes, err := w.nodes(ctx)
	if err != nil {
		return nil, err
	}
	selected := matching(sel, nodes)
	if err := w.authorize(ctx, nm.Name, "create it", selected); err != nil {
		return nil, err
	}
	if err := w.keepsALoadBalancerHost(ctx, nm, selected, nodes); err != nil {
		return nil, err
	}
	return allNodesWarning(selected, nodes), nil
}

// ValidateUpdate checks the spec and that the user may delete the nodes
// the change concerns: every selected node when the stage changes (moving
// someone's Idle maintenance to Drain, or any to Complete, needs what
// creating it needed), the added and the dropped ones when the selection
// changes (a dropped node is put back into service). A stage
// change on a maintenance being deleted is the controller completing it:
// the deletion was authorized already.
func (w *NodeMaintenance) ValidateUpdate(ctx context.Context, old, nm *v1alpha1.NodeMaintenance) (admission.Warnings, error) {
	sel, err := validateSpec(nm)
	if err != nil {
		return nil, err
	}
	oldSel, err := nodeaffinity.NewNodeSelector(old.Spec.NodeSelector)
	if err != nil {
		oldSel = nil // a selector stored before validation existed: treat everything as new
	}
	nodes, err := w.nodes(ctx)
	if err != nil {
		return nil, err
	}
	var added, dropped []string
	selected := matching(sel, nodes)
	for _, n := range nodes {
		switch now, before := sel.Match(n), oldSel != nil && oldSel.Match(n); {
		case now && (!before || oldSel == nil):
			added = append(added, n.Name)
		case before && !now:
			dropped = append(dropped, n.Name)
		}
	}
	// A dropped node is released (uncordoned, its draining taint removed,
	// its Evacuations withdrawn): putting nodes back into service needs
	// what taking them out did.
	what, concerned := "widen it", added
	switch {
	case len(dropped) > 0 && len(added) > 0:
		what, concerned = "change its selection", append(added, dropped...)
	case len(dropped) > 0:
		what, concerned = "narrow it", dropped
	}
	if old.Spec.Stage != nm.Spec.Stage && nm.DeletionTimestamp == nil {
		what, concerned = fmt.Sprintf("move it to stage %s", nm.Spec.Stage), selected
	}
	if err := w.authorize(ctx, nm.Name, what, concerned); err != nil {
		return nil, err
	}
	// Checked when a maintenance enters Drain or widens in it, not at
	// every update: one already draining must be able to proceed.
	if old.Spec.Stage != v1alpha1.Drain || len(added) > 0 {
		if err := w.keepsALoadBalancerHost(ctx, nm, selected, nodes); err != nil {
			return nil, err
		}
	}
	return allNodesWarning(selected, nodes), nil
}

// ValidateDelete requires that the user may delete every selected node.
func (w *NodeMaintenance) ValidateDelete(ctx context.Context, nm *v1alpha1.NodeMaintenance) (admission.Warnings, error) {
	sel, err := nodeaffinity.NewNodeSelector(nm.Spec.NodeSelector)
	if err != nil {
		return nil, nil // nothing can be matched by an invalid selector
	}
	nodes, err := w.nodes(ctx)
	if err != nil {
		return nil, err
	}
	return nil, w.authorize(ctx, nm.Name, "delete it", matching(sel, nodes))
}

// validateSpec checks what the CRD's schema cannot: the node selector and
// the drain plan's order.
func validateSpec(nm *v1alpha1.NodeMaintenance) (*nodeaffinity.NodeSelector, error) {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	var sel *nodeaffinity.NodeSelector
	switch ns := nm.Spec.NodeSelector; {
	case ns == nil:
		errs = append(errs, field.Required(spec.Child("nodeSelector"), "select the nodes to maintain, e.g. nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [NODE]}]}]"))
	case len(ns.NodeSelectorTerms) == 0:
		errs = append(errs, field.Required(spec.Child("nodeSelector", "nodeSelectorTerms"), "give at least one term with requirements, e.g. matchFields: [{key: metadata.name, operator: In, values: [NODE]}]"))
	case !slices.ContainsFunc(ns.NodeSelectorTerms, func(t corev1.NodeSelectorTerm) bool { return len(t.MatchExpressions)+len(t.MatchFields) > 0 }):
		// Kubernetes' node selectors match nothing with an empty term; a
		// maintenance of no node is a mistake, most likely meant as "all".
		errs = append(errs, field.Invalid(spec.Child("nodeSelector", "nodeSelectorTerms"), field.OmitValueType{},
			"a term without matchExpressions or matchFields selects no node: name the nodes, e.g. matchFields: [{key: metadata.name, operator: In, values: [NODE]}], or, for every node, matchExpressions: [{key: kubernetes.io/hostname, operator: Exists}]"))
	default:
		var err error
		if sel, err = nodeaffinity.NewNodeSelector(ns, field.WithPath(spec.Child("nodeSelector"))); err != nil {
			errs = append(errs, field.Invalid(spec.Child("nodeSelector"), field.OmitValueType{}, err.Error()))
		}
	}
	errs = append(errs, drainplan.Validate(nm.Spec.DrainPlan, spec.Child("drainPlan"))...)
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(nmKind, nm.Name, errs)
	}
	return sel, nil
}

func (w *NodeMaintenance) nodes(ctx context.Context) ([]*corev1.Node, error) {
	var list corev1.NodeList
	if err := w.Client.List(ctx, &list); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("listing nodes: %w", err))
	}
	out := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func matching(sel *nodeaffinity.NodeSelector, nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		if sel.Match(n) {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

func allNodesWarning(selected []string, nodes []*corev1.Node) admission.Warnings {
	if len(nodes) == 0 || len(selected) < len(nodes) {
		return nil
	}
	return admission.Warnings{fmt.Sprintf(
		"spec.nodeSelector selects all %d nodes of the cluster: maintaining every node at once may leave the cluster degraded and unable to recover", len(nodes))}
}

// MaxNodeReviews is the most nodes a change may concern for the webhook to
// authorize it node by node; above it, only a user who may delete every
// node is allowed.
const MaxNodeReviews = 100

// authorize checks, with SubjectAccessReviews, that the requesting user
// may delete each node: a maintenance can take nodes out of service, so
// only someone who could delete them may start, widen or end one.
func (w *NodeMaintenance) authorize(ctx context.Context, name, what string, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("reading the admission request: %w", err))
	}
	user := req.UserInfo
	review := func(node string) (bool, error) {
		ok, err := mayDo(ctx, w.Client, user, authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes", Version: "v1", Name: node})
		if err != nil {
			return false, apierrors.NewInternalError(fmt.Errorf("checking whether %s may delete nodes: %w", user.Username, err))
		}
		return ok, nil
	}
	// One review for all nodes covers the common case (an administrator).
	if ok, err := review(""); err != nil || ok {
		return err
	}
	// One review per node above this would let one request cost the API
	// server (and ebb's client rate) many: admission, which every
	// NodeMaintenance write waits for, could be starved by a flood.
	if len(nodes) > MaxNodeReviews {
		return apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("nodemaintenances").GroupResource(), name, fmt.Errorf(
			"user %q may not delete every node, and this change concerns %d nodes: above %d, only someone who may delete every node may %s (one authorization check per node is not made for so many). "+
				"Ask for the 'delete' permission on nodes without resourceNames, or split the maintenance into maintenances of at most %d nodes",
			user.Username, len(nodes), MaxNodeReviews, what, MaxNodeReviews))
	}
	var denied []string
	for _, n := range nodes {
		ok, err := review(n)
		if err != nil {
			return err
		}
		if !ok {
			denied = append(denied, n)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	instead := "or narrow spec.nodeSelector"
	if what == "narrow it" || what == "change its selection" {
		instead = "or keep these nodes in spec.nodeSelector (leaving it puts a node back into service)"
	}
	return apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("nodemaintenances").GroupResource(), name, fmt.Errorf(
		"user %q may not delete node(s) %s, and only someone who may delete every node a NodeMaintenance selects may %s: ask for the 'delete' permission on these nodes, %s",
		user.Username, strings.Join(denied, ", "), what, instead))
}
