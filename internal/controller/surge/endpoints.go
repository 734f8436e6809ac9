package surge

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch

// endpointsWaiting says which Services that send traffic to pod list no
// Ready endpoint of one of its peers (the Deployment's other Ready pods)
// yet ("" when every one does). A Pod's Ready condition is not yet
// traffic: the EndpointSlice controller has to list the pod, and every
// node's proxy to learn it. Scaling back before that leaves the proxies
// with the leaving pod as the only endpoint (they fall back to terminating
// endpoints that still serve) until it stops, and with a dead one for as
// long as they lag after that: requests to a surged single replica timed
// out in the demo on real kubelets. One peer per Service is enough for
// that, and a Service that selects only some of the pods does not hold
// the surge.
func (s *Evacuator) endpointsWaiting(ctx context.Context, pod *corev1.Pod, peers map[types.UID]bool) (string, error) {
	var list discoveryv1.EndpointSliceList
	if err := s.Client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
		return "", fmt.Errorf("listing EndpointSlices: %w", err)
	}
	serves := map[string]bool{}  // Services with an endpoint of pod
	covered := map[string]bool{} // ... and a Ready endpoint of a peer
	for _, sl := range list.Items {
		svc := sl.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		for _, ep := range sl.Endpoints {
			ref := ep.TargetRef
			if ref == nil || ref.Kind != "Pod" {
				continue
			}
			switch {
			case ref.UID == pod.UID:
				serves[svc] = true
			case peers[ref.UID] && (ep.Conditions.Ready == nil || *ep.Conditions.Ready): // unset means ready
				covered[svc] = true
			}
		}
	}
	var short []string
	for svc := range serves {
		if !covered[svc] {
			short = append(short, svc)
		}
	}
	if len(short) == 0 {
		return "", nil
	}
	slices.Sort(short)
	return "Service(s) " + strings.Join(short, ", ") + " list no other pod of the Deployment as a Ready endpoint yet", nil
}
