package lbmodel

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Taints of the tools that remove nodes, leaving signals by default.
const (
	// TaintKarpenterDisrupted is the taint Karpenter puts on a node it is
	// about to disrupt (consolidation, drift, expiry), before it replaces
	// and deletes it (kubernetes-sigs/karpenter, pkg/apis/v1:
	// DisruptedNoScheduleTaint, no value).
	TaintKarpenterDisrupted = "karpenter.sh/disrupted"
	// TaintMedik8sDrain is the taint medik8s' node-maintenance-operator
	// puts on a node it drains for a NodeMaintenance (no value).
	TaintMedik8sDrain = "medik8s.io/drain"
	// taintUnschedulable is cordon's taint: never a leaving signal.
	taintUnschedulable = "node.kubernetes.io/unschedulable"
)

// SignalKind says where on a Node a leaving signal is read.
type SignalKind string

// Signal kinds.
const (
	SignalTaint SignalKind = "taint"
	SignalLabel SignalKind = "label"
)

// LeavingSignal is one thing that makes a node leaving: a taint or a label
// with Key, and, when Value is not empty, that value only.
type LeavingSignal struct {
	Kind  SignalKind
	Key   string
	Value string
}

// String is the signal as written in the configuration:
// kind:key or kind:key=value.
func (s LeavingSignal) String() string {
	if s.Value == "" {
		return string(s.Kind) + ":" + s.Key
	}
	return string(s.Kind) + ":" + s.Key + "=" + s.Value
}

// matches reports whether node carries the signal.
func (s LeavingSignal) matches(node *corev1.Node) bool {
	switch s.Kind {
	case SignalTaint:
		for _, t := range node.Spec.Taints {
			if t.Key == s.Key && (s.Value == "" || t.Value == s.Value) {
				return true
			}
		}
	case SignalLabel:
		v, ok := node.Labels[s.Key]
		return ok && (s.Value == "" || v == s.Value)
	}
	return false
}

// draining is ebb's own signal (a NodeMaintenance's taint): it always
// counts, whatever the configuration says, or maintenances would not drain.
var draining = LeavingSignal{Kind: SignalTaint, Key: TaintDraining}

// defaultLeavingSignals backs DefaultLeavingSignals; never changed.
var defaultLeavingSignals = []LeavingSignal{
	{Kind: SignalTaint, Key: TaintOutOfService},
	{Kind: SignalTaint, Key: TaintAzureDraining, Value: SpotEvictionValue},
	{Kind: SignalTaint, Key: TaintToBeDeleted},
	{Kind: SignalTaint, Key: TaintKarpenterDisrupted},
	{Kind: SignalTaint, Key: TaintMedik8sDrain},
}

// DefaultLeavingSignals are the signals that count when none are
// configured, besides ebb.dev/draining which always does: the
// out-of-service taint, Azure's spot eviction, the cluster autoscaler's,
// Karpenter's and medik8s' taints. docs/nodes-that-leave.md.
func DefaultLeavingSignals() []LeavingSignal {
	return slices.Clone(defaultLeavingSignals)
}

// ParseLeavingSignals reads a leaving-signal configuration: one signal per
// line, written kind:key or kind:key=value (kind taint or label; key a
// qualified name as for labels and taints; value a label value), with
// blank lines, lines starting with # and repeats ignored. An error names the line
// and says how to write it. An empty configuration is valid: only
// ebb.dev/draining then counts.
func ParseLeavingSignals(text string) ([]LeavingSignal, error) {
	var out []LeavingSignal
	seen := map[LeavingSignal]bool{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseLeavingSignal(line)
		if err != nil {
			return nil, fmt.Errorf("leaving signal on line %d (%q): %w", i+1, line, err)
		}
		if seen[s] {
			continue // harmless: the API server's policy lets it through too
		}
		seen[s] = true
		out = append(out, s)
	}
	if out == nil {
		out = []LeavingSignal{}
	}
	return out, nil
}

func parseLeavingSignal(line string) (LeavingSignal, error) {
	const how = "write taint:KEY, taint:KEY=VALUE, label:KEY or label:KEY=VALUE"
	kind, rest, ok := strings.Cut(line, ":")
	if !ok {
		return LeavingSignal{}, fmt.Errorf("no kind: %s", how)
	}
	s := LeavingSignal{Kind: SignalKind(kind)}
	if s.Kind != SignalTaint && s.Kind != SignalLabel {
		return LeavingSignal{}, fmt.Errorf("kind %q is neither taint nor label: %s", kind, how)
	}
	key, value, hasValue := strings.Cut(rest, "=")
	s.Key, s.Value = key, value
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return LeavingSignal{}, fmt.Errorf("key %q: %s", key, strings.Join(errs, "; "))
	}
	if hasValue {
		if value == "" {
			return LeavingSignal{}, fmt.Errorf("empty value after '=': leave out '=' to match any value")
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return LeavingSignal{}, fmt.Errorf("value %q: %s", value, strings.Join(errs, "; "))
		}
	}
	if s.Kind == SignalTaint && key == taintUnschedulable {
		return LeavingSignal{}, fmt.Errorf("%s is cordon's taint, and cordon alone never makes a node leaving (kured, system-upgrade-controller and kubectl drain cordon nodes that come back): use the taint or label of the tool that removes the node", key)
	}
	return s, nil
}

// IsLeaving reports whether a node carries a leaving signal, and which
// (its key): ebb's own first, then the configured ones (the defaults when
// none are), without the autoscaler's taint when it is ignored. It runs
// for every backend of every Service, so it allocates nothing.
func IsLeaving(node *corev1.Node, opts Options) (bool, string) {
	if draining.matches(node) {
		return true, draining.Key
	}
	signals := opts.LeavingSignals
	if signals == nil {
		signals = defaultLeavingSignals
	}
	for _, s := range signals {
		if opts.IgnoreAutoscalerTaint && s.Kind == SignalTaint && s.Key == TaintToBeDeleted {
			continue
		}
		if s.matches(node) {
			return true, s.Key
		}
	}
	return false, ""
}
