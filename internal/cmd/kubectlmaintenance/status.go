package kubectlmaintenance

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
)

// maxBlockers is how many blocked pods status names per node.
const maxBlockers = 5

func newStatusCommand(o *options) *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show the progress of maintenances and what holds them back",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return o.status(cmd.Context(), c, name, watch)
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "keep showing the progress until the maintenance is drained or complete")
	return cmd
}

// status prints one maintenance (or all), once or until it settles.
func (o *options) status(ctx context.Context, c client.Client, name string, watch bool) error {
	last := ""
	for {
		nms, err := o.maintenances(ctx, c, name)
		if err != nil {
			return err
		}
		if printed, err := o.printObject(listOrOne(nms, name)); printed || err != nil {
			return err
		}
		var buf bytes.Buffer
		for _, nm := range nms {
			if err := o.describe(ctx, c, &buf, &nm); err != nil {
				return err
			}
		}
		if len(nms) == 0 {
			buf.WriteString("No NodeMaintenances.\n")
		}
		if text := buf.String(); text != last {
			fmt.Fprint(o.out, text)
			last = text
		}
		if !watch || settled(nms) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (o *options) maintenances(ctx context.Context, c client.Client, name string) ([]v1alpha1.NodeMaintenance, error) {
	if name != "" {
		nm, err := o.get(ctx, c, name)
		if err != nil {
			return nil, err
		}
		return []v1alpha1.NodeMaintenance{*nm}, nil
	}
	var list v1alpha1.NodeMaintenanceList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NodeMaintenances: %w", err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

func listOrOne(nms []v1alpha1.NodeMaintenance, name string) any {
	for i := range nms {
		nms[i].SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeMaintenance"))
	}
	if name != "" && len(nms) == 1 {
		return &nms[0]
	}
	list := &v1alpha1.NodeMaintenanceList{Items: nms}
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeMaintenanceList"))
	return list
}

// settled reports whether watching can stop: every maintenance drained,
// only cordoning, completed or idle.
func settled(nms []v1alpha1.NodeMaintenance) bool {
	for _, nm := range nms {
		if nm.Spec.Stage == v1alpha1.Drain && !meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition) {
			return false
		}
	}
	return true
}

// describe writes one maintenance: a header, then per node a progress bar,
// the drain targets, the drain message and what blocks progress.
func (o *options) describe(ctx context.Context, c client.Client, w io.Writer, nm *v1alpha1.NodeMaintenance) error {
	drained := "Unknown"
	if cond := meta.FindStatusCondition(nm.Status.Conditions, v1alpha1.DrainedCondition); cond != nil {
		drained = string(cond.Status)
	}
	fmt.Fprintf(w, "%s: stage %s, drained %s, %d node(s), age %s", nm.Name, nm.Spec.Stage, drained, len(nm.Status.NodeStatuses), o.age(nm.CreationTimestamp.Time))
	if nm.Spec.Reason != "" {
		fmt.Fprintf(w, ", reason %q", nm.Spec.Reason)
	}
	fmt.Fprintln(w)
	if nm.Spec.Stage != v1alpha1.Drain {
		for _, ns := range nm.Status.NodeStatuses {
			fmt.Fprintf(w, "  %s\n", ns.NodeRef.Name)
		}
		return nil
	}
	var evacs v1alpha1.EvacuationList
	if err := c.List(ctx, &evacs); err != nil {
		return fmt.Errorf("listing Evacuations: %w", err)
	}
	evacuated := map[string]bool{} // pods with an Evacuation, by namespace/name
	for _, e := range evacs.Items {
		evacuated[e.Namespace+"/"+e.Spec.PodRef.Name] = true
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, ns := range nm.Status.NodeStatuses {
		left := ns.PodsPendingEvacuation + ns.PodsEvacuating
		total := max(ns.PodsTotal, left)
		fmt.Fprintf(tw, "  %s\t%s\t%d/%d evacuated, %d evacuating, %d pending\ttargets: %s\n",
			ns.NodeRef.Name, bar(total-left, total, 20), total-left, total, ns.PodsEvacuating, ns.PodsPendingEvacuation, targets(ns.DrainTargets))
	}
	_ = tw.Flush()
	for _, ns := range nm.Status.NodeStatuses {
		lines := blockers(evacs.Items, ns.NodeRef.Name, o.now())
		if ns.PodsPendingEvacuation > 0 {
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.MatchingFields{"spec.nodeName": ns.NodeRef.Name}); err != nil {
				return fmt.Errorf("listing the pods of node %s: %w", ns.NodeRef.Name, err)
			}
			lines = append(lines, heldBack(pods.Items, evacuated, ns.DrainTargets)...)
		}
		if ns.DrainMessage == "" && len(lines) == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", ns.NodeRef.Name, ns.DrainMessage)
		for i, l := range lines {
			if i == maxBlockers {
				fmt.Fprintf(w, "    ... and %d more\n", len(lines)-maxBlockers)
				break
			}
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return nil
}

// blockers says, per Evacuation on the node, what it waits for.
func blockers(evacs []v1alpha1.Evacuation, node string, now time.Time) []string {
	var out []string
	for _, e := range evacs {
		if e.Labels[v1alpha1.EvacuationNodeLabel] != node {
			continue
		}
		pod := e.Namespace + "/" + e.Spec.PodRef.Name
		switch {
		case e.Status.FailedEvictionCounter > 0:
			next := ""
			if t := e.Status.NextEvictionTime; t != nil && t.After(now) {
				next = "; next attempt in " + duration.HumanDuration(t.Sub(now))
			}
			out = append(out, fmt.Sprintf("%s: %s (%d evictions refused%s)", pod, strings.TrimPrefix(e.Status.Message, "Eviction blocked: "), e.Status.FailedEvictionCounter, next))
		case e.Status.ActiveEvacuatorClass != "":
			since := "no progress reported yet"
			if ts := e.Status.EvacuationProgressTimestamp; ts != nil {
				since = "last progress " + duration.HumanDuration(now.Sub(ts.Time)) + " ago"
			}
			msg := ""
			if e.Status.Message != "" {
				msg = ": " + e.Status.Message
			}
			out = append(out, fmt.Sprintf("%s: evacuator %s, %s%s", pod, e.Status.ActiveEvacuatorClass, since, msg))
		}
	}
	sort.Strings(out)
	return out
}

// heldBack names the pods of a node that the drain plan keeps for a later
// step: no Evacuation yet, and the node's targets do not reach them. Static
// pods and DaemonSet pods that tolerate the draining taint never leave
// through the plan; the drain message names them.
func heldBack(pods []corev1.Pod, evacuated map[string]bool, targets []v1alpha1.DrainPlanEntry) []string {
	var out []string
	for i := range pods {
		p := &pods[i]
		key := p.Namespace + "/" + p.Name
		if evacuated[key] || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			drainplan.TypeOf(p) == v1alpha1.Static || drainplan.ToleratesDraining(p) || drainplan.Matches(targets, p) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: held back by the drain plan (%s pod, priority %d): it leaves at a later step", key, drainplan.TypeOf(p), ptr.Deref(p.Spec.Priority, 0)))
	}
	sort.Strings(out)
	return out
}

func bar(done, total int32, width int) string {
	if total <= 0 {
		return "[" + strings.Repeat("#", width) + "]"
	}
	n := int(done) * width / int(total)
	return "[" + strings.Repeat("#", n) + strings.Repeat("-", width-n) + "]"
}

func targets(ts []v1alpha1.DrainPlanEntry) string {
	if len(ts) == 0 {
		return "none yet"
	}
	var parts []string
	for _, t := range ts {
		s := fmt.Sprintf("%s<=%d", t.PodType, t.PodPriority)
		if t.PodSelector != nil {
			s += "(" + formatSelector(t) + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func formatSelector(t v1alpha1.DrainPlanEntry) string {
	var kv []string
	for k, v := range t.PodSelector.MatchLabels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	if len(t.PodSelector.MatchExpressions) > 0 {
		kv = append(kv, "...")
	}
	return strings.Join(kv, ",")
}

func (o *options) age(t time.Time) string { return duration.HumanDuration(o.now().Sub(t)) }

func newListCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List NodeMaintenances",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			nms, err := o.maintenances(cmd.Context(), c, "")
			if err != nil {
				return err
			}
			if printed, err := o.printObject(listOrOne(nms, "")); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(o.out, 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTAGE\tNODES\tDRAINED\tREASON\tAGE")
			for _, nm := range nms {
				var nodes []string
				for _, ns := range nm.Status.NodeStatuses {
					nodes = append(nodes, ns.NodeRef.Name)
				}
				drained := ""
				if cond := meta.FindStatusCondition(nm.Status.Conditions, v1alpha1.DrainedCondition); cond != nil {
					drained = string(cond.Status)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", nm.Name, nm.Spec.Stage, strings.Join(nodes, ","), drained, nm.Spec.Reason, o.age(nm.CreationTimestamp.Time))
			}
			return tw.Flush()
		},
	}
}
