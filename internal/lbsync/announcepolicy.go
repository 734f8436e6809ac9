package lbsync

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
	"github.com/ebbdev/ebb/internal/announce/bgp"
)

// +kubebuilder:rbac:groups=lb.ebb.dev,resources=announcementpolicies;addresspools,verbs=get;list;watch

// AnnouncementPlan says how this host announces each address it serves,
// from the AnnouncementPolicies that choose it. The zero plan (no policy
// exists) announces every address in every way the host is set up for.
type AnnouncementPlan struct {
	// Policies is set once any AnnouncementPolicy exists: an address is
	// then announced in a way only where a rule says so.
	Policies bool
	rules    []announceRule
}

// announceRule is one policy that chooses this host.
type announceRule struct {
	name string
	// ranges are the addresses of its pools (all: every address).
	ranges []addrrange.Range
	all    bool
	bgp    bool
	// bgpAttrs are what its routes carry (communities, local preference).
	bgpAttrs bgp.Attributes
	// aggregate4 and aggregate6 are its aggregation lengths (0: host
	// routes); pools are the entries of its pools, inside which an
	// aggregate must lie.
	aggregate4, aggregate6 int
	pools                  []poolEntry
	l2                     bool
	// interfaces limit L2 (nil: every interface).
	interfaces []string
}

func (r announceRule) covers(a netip.Addr) bool {
	return r.all || slices.ContainsFunc(r.ranges, func(rg addrrange.Range) bool { return rg.Contains(a) })
}

// BGP says whether a is announced by BGP.
func (p AnnouncementPlan) BGP(a netip.Addr) bool {
	if !p.Policies {
		return true
	}
	return slices.ContainsFunc(p.rules, func(r announceRule) bool { return r.bgp && r.covers(a) })
}

// BGPRoute is a's route: its host route, or the aggregate the policies
// announcing it by BGP from this host give it (the longest of theirs, so
// the most specific, that lies inside the policy's pools), carrying every
// community of those policies and the highest local preference among
// them.
func (p AnnouncementPlan) BGPRoute(a netip.Addr) bgp.Route {
	a = a.Unmap()
	route := bgp.Route{Addr: a}
	bits := 0
	for _, r := range p.rules {
		if !r.bgp || !r.covers(a) {
			continue
		}
		route.Attrs = route.Attrs.Merge(r.bgpAttrs)
		l := r.aggregate(a)
		bits = max(bits, l)
	}
	if bits > 0 && bits < a.BitLen() {
		route.Prefix = netip.PrefixFrom(a, bits).Masked()
	}
	return route
}

// aggregate is the prefix length of a's route by this rule: its
// aggregation length where the aggregate lies inside one of its pools'
// entries, a's host route otherwise.
func (r announceRule) aggregate(a netip.Addr) int {
	l := r.aggregate4
	if a.Is6() {
		l = r.aggregate6
	}
	if l == 0 || l >= a.BitLen() {
		return a.BitLen()
	}
	agg := netip.PrefixFrom(a, l).Masked()
	if slices.ContainsFunc(r.pools, func(e poolEntry) bool { return e.holds(agg) }) {
		return l
	}
	return a.BitLen()
}

// poolEntry is one entry of an AddressPool's addresses, as written: a
// CIDR (its network and broadcast addresses, which the pool does not give
// out, still belong to it) or a range.
type poolEntry struct {
	prefix netip.Prefix
	rg     addrrange.Range
}

func parsePoolEntry(s string) (poolEntry, bool) {
	if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
		return poolEntry{prefix: p.Masked()}, true
	}
	rg, err := addrrange.Parse(s)
	return poolEntry{rg: rg}, err == nil
}

// holds says whether the whole of p lies inside the entry.
func (e poolEntry) holds(p netip.Prefix) bool {
	if e.prefix.IsValid() {
		return e.prefix.Addr().Is4() == p.Addr().Is4() && e.prefix.Bits() <= p.Bits() && e.prefix.Contains(p.Addr())
	}
	return e.rg.Contains(p.Addr()) && e.rg.Contains(addrrange.Last(p))
}

func (e poolEntry) String() string {
	if e.prefix.IsValid() {
		return e.prefix.String()
	}
	return e.rg.From.String() + "-" + e.rg.To.String()
}

// L2 says whether a is announced by L2, and on which interfaces (nil: on
// every one).
func (p AnnouncementPlan) L2(a netip.Addr) (bool, []string) {
	if !p.Policies {
		return true, nil
	}
	ok := false
	var ifaces []string
	for _, r := range p.rules {
		if !r.l2 || !r.covers(a) {
			continue
		}
		if r.interfaces == nil {
			return true, nil // one policy allows every interface
		}
		ok = true
		ifaces = append(ifaces, r.interfaces...)
	}
	slices.Sort(ifaces)
	return ok, slices.Compact(ifaces)
}

// L2Interfaces are the interfaces the policies choosing this host name for
// L2, sorted (a policy naming none uses the host's --l2-interface ones).
func (p AnnouncementPlan) L2Interfaces() []string {
	var out []string
	for _, r := range p.rules {
		if r.l2 {
			out = append(out, r.interfaces...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Equal compares two plans.
func (p AnnouncementPlan) Equal(q AnnouncementPlan) bool {
	return p.Policies == q.Policies && slices.EqualFunc(p.rules, q.rules, func(a, b announceRule) bool {
		return a.name == b.name && a.all == b.all && a.bgp == b.bgp && a.bgpAttrs.Equal(b.bgpAttrs) && a.l2 == b.l2 &&
			a.aggregate4 == b.aggregate4 && a.aggregate6 == b.aggregate6 && slices.Equal(a.pools, b.pools) &&
			slices.Equal(a.ranges, b.ranges) && slices.Equal(a.interfaces, b.interfaces)
	})
}

// String names the policies that choose this host, for logs.
func (p AnnouncementPlan) String() string {
	if !p.Policies {
		return "no AnnouncementPolicy: every address in every way"
	}
	names := make([]string, len(p.rules))
	for i, r := range p.rules {
		names[i] = r.name
	}
	return "AnnouncementPolicies " + strings.Join(names, ", ")
}

// PlanAnnouncements builds this host's plan from the policies and pools
// (node nil: unknown, so only policies without a nodeSelector choose it).
// Problems name what a policy refers to and cannot be read; the rest of
// the policy still applies (a missing pool announces nothing for it).
func PlanAnnouncements(node *corev1.Node, policies []lbv1alpha1.AnnouncementPolicy, pools []lbv1alpha1.AddressPool) (AnnouncementPlan, []string) {
	plan := AnnouncementPlan{Policies: len(policies) > 0}
	var problems []string
	byName := map[string][]addrrange.Range{}
	entries := map[string][]poolEntry{}
	for _, p := range pools {
		for _, s := range p.Spec.Addresses {
			if r, err := addrrange.Parse(s); err == nil {
				byName[p.Name] = append(byName[p.Name], r)
			}
			if e, ok := parsePoolEntry(s); ok {
				entries[p.Name] = append(entries[p.Name], e)
			}
		}
	}
	var nodeLabels labels.Set
	if node != nil {
		nodeLabels = node.Labels
	}
	policies = slices.Clone(policies)
	slices.SortFunc(policies, func(a, b lbv1alpha1.AnnouncementPolicy) int { return strings.Compare(a.Name, b.Name) })
	for _, pol := range policies {
		if pol.Spec.NodeSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(pol.Spec.NodeSelector)
			if err != nil {
				problems = append(problems, fmt.Sprintf("AnnouncementPolicy %s: invalid nodeSelector: %v", pol.Name, err))
				continue
			}
			if !sel.Matches(nodeLabels) {
				continue
			}
		}
		r := announceRule{name: pol.Name, all: len(pol.Spec.AddressPools) == 0, bgp: pol.Spec.BGP != nil, l2: pol.Spec.L2 != nil}
		for _, name := range pol.Spec.AddressPools {
			ranges, ok := byName[name]
			if !ok {
				problems = append(problems, fmt.Sprintf("AnnouncementPolicy %s: no AddressPool %s", pol.Name, name))
			}
			r.ranges = append(r.ranges, ranges...)
			r.pools = append(r.pools, entries[name]...)
		}
		if pol.Spec.BGP != nil {
			var bad []string
			r.bgpAttrs, bad = routeAttributes(pol.Spec.BGP)
			for _, b := range bad {
				problems = append(problems, fmt.Sprintf("AnnouncementPolicy %s: %s (left out)", pol.Name, b))
			}
			r.aggregate4, r.aggregate6 = aggregationLength(pol.Spec.BGP.AggregationLength, 32), aggregationLength(pol.Spec.BGP.AggregationLengthV6, 128)
			problems = append(problems, r.aggregationProblems(pol.Name)...)
		}
		if pol.Spec.L2 != nil && len(pol.Spec.L2.Interfaces) > 0 {
			r.interfaces = slices.Sorted(slices.Values(pol.Spec.L2.Interfaces))
		}
		plan.rules = append(plan.rules, r)
	}
	return plan, append(problems, overriddenAggregation(plan.rules)...)
}

// overriddenAggregation names the aggregating policies whose addresses
// another policy announces by BGP without aggregation from the same host:
// those addresses go as host routes (the most specific route wins), which
// would otherwise be silent.
func overriddenAggregation(rules []announceRule) []string {
	var out []string
	for _, r := range rules {
		if !r.bgp || (r.aggregate4 == 0 && r.aggregate6 == 0) {
			continue
		}
		for _, o := range rules {
			if o.name == r.name || !o.bgp || !o.overlaps(r) {
				continue
			}
			if (r.aggregate4 > 0 && o.aggregate4 == 0) || (r.aggregate6 > 0 && o.aggregate6 == 0) {
				out = append(out, fmt.Sprintf("AnnouncementPolicy %s announces addresses of AnnouncementPolicy %s by BGP without aggregation: those go as host routes", o.name, r.name))
			}
		}
	}
	return out
}

// overlaps says whether r and o cover an address in common.
func (r announceRule) overlaps(o announceRule) bool {
	if r.all || o.all {
		return true
	}
	for _, a := range r.ranges {
		for _, b := range o.ranges {
			if a.Contains(b.From) || a.Contains(b.To) || b.Contains(a.From) {
				return true
			}
		}
	}
	return false
}

// aggregationLength reads an aggregation length of a family of bits
// (0: host routes, also for a value out of range, which admission
// refuses).
func aggregationLength(l *int32, bits int) int {
	if l == nil || *l <= 0 || int(*l) >= bits {
		return 0
	}
	return int(*l)
}

// aggregationProblems names the pool entries of an aggregating rule whose
// edges its aggregates would reach past: those addresses go as host
// routes.
func (r announceRule) aggregationProblems(policy string) []string {
	var out []string
	for _, e := range r.pools {
		first, last := e.rg.From, e.rg.To
		if e.prefix.IsValid() {
			first, last = e.prefix.Addr(), addrrange.Last(e.prefix)
		}
		l := r.aggregate4
		if first.Is6() {
			l = r.aggregate6
		}
		if l == 0 {
			continue
		}
		if r.aggregate(first) != l || r.aggregate(last) != l {
			out = append(out, fmt.Sprintf("AnnouncementPolicy %s: the /%d aggregates of %s would reach outside the policy's pools: addresses whose aggregate does go as host routes", policy, l, e))
		}
	}
	return out
}

// routeAttributes reads a policy's BGP attributes; what does not parse
// (admission refuses it, but an object may predate the rule) is left out
// and said.
func routeAttributes(spec *lbv1alpha1.BGPAnnouncement) (bgp.Attributes, []string) {
	var attrs bgp.Attributes
	var bad []string
	for _, s := range spec.Communities {
		c, err := bgp.ParseCommunity(s)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		attrs.Communities = append(attrs.Communities, c)
	}
	for _, s := range spec.LargeCommunities {
		c, err := bgp.ParseLargeCommunity(s)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		attrs.LargeCommunities = append(attrs.LargeCommunities, c)
	}
	if lp := spec.LocalPreference; lp != nil {
		if *lp < 0 || *lp > math.MaxUint32 {
			bad = append(bad, fmt.Sprintf("localPreference %d: must be 0 to 4294967295", *lp))
		} else {
			v := uint32(*lp)
			attrs.LocalPreference = &v
		}
	}
	// Merge sorts and drops duplicates.
	return bgp.Attributes{}.Merge(attrs), bad
}

// AnnouncementPolicies follows the AnnouncementPolicies and AddressPools
// and tells this host's plan whenever it changes.
type AnnouncementPolicies struct {
	// Cache holds AnnouncementPolicies, AddressPools and this host's Node;
	// the caller starts it.
	Cache ctrlcache.Cache
	// Node is this host's Node (empty: only policies without a
	// nodeSelector choose it).
	Node     string
	OnChange func(plan AnnouncementPlan)
}

// Run follows the policies until ctx is done.
func (f *AnnouncementPolicies) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("announcement-policies")
	changed, err := watchAll(ctx, f.Cache, &lbv1alpha1.AnnouncementPolicy{}, &lbv1alpha1.AddressPool{}, &corev1.Node{})
	if err != nil {
		return err
	}
	var last AnnouncementPlan
	var lastProblems []string
	for first := true; ; first = false {
		plan, problems, err := f.read(ctx)
		if err != nil {
			log.Error(err, "Reading the AnnouncementPolicies")
		} else {
			if !slices.Equal(problems, lastProblems) && len(problems) > 0 {
				log.Info("AnnouncementPolicies this host cannot follow in full", "problems", problems)
			}
			lastProblems = problems
			if first || !plan.Equal(last) {
				last = plan
				log.Info("Announcing", "plan", plan.String())
				f.OnChange(plan)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func (f *AnnouncementPolicies) read(ctx context.Context) (AnnouncementPlan, []string, error) {
	var policies lbv1alpha1.AnnouncementPolicyList
	if err := f.Cache.List(ctx, &policies); err != nil {
		return AnnouncementPlan{}, nil, err
	}
	var pools lbv1alpha1.AddressPoolList
	if err := f.Cache.List(ctx, &pools); err != nil {
		return AnnouncementPlan{}, nil, err
	}
	var node *corev1.Node
	if f.Node != "" {
		var n corev1.Node
		if err := f.Cache.Get(ctx, keyOf(f.Node), &n); err == nil {
			node = &n
		}
	}
	plan, problems := PlanAnnouncements(node, policies.Items, pools.Items)
	return plan, problems, nil
}
