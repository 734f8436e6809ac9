package lbsync

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// replicaView is one `ebb lb` replica's caches, filled in its own order.
func replicaView(t *testing.T, objs []any) (corelisters.ServiceLister, discoverylisters.EndpointSliceLister, corelisters.NodeLister) {
	t.Helper()
	svcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	slices := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range objs {
		var err error
		switch o.(type) {
		case *corev1.Service:
			err = svcs.Add(o)
		case *discoveryv1.EndpointSlice:
			err = slices.Add(o)
		case *corev1.Node:
			err = nodes.Add(o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewServiceLister(svcs), discoverylisters.NewEndpointSliceLister(slices), corelisters.NewNodeLister(nodes)
}

// Several replicas that see the same objects, whatever order their caches
// filled in, compute the same configuration, byte for byte: they serve the
// same frontends with the same backends in the same order (so round robin
// and the Maglev tables agree too).
func TestReplicasComputeTheSameConfiguration(t *testing.T) {
	var objs []any
	for i := range 3 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i+1)},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.0.%d", i+1)}}}}
		if i == 1 {
			n.Spec.Taints = []corev1.Taint{{Key: lbmodel.TaintDraining, Effect: corev1.TaintEffectNoSchedule}}
		}
		objs = append(objs, n)
	}
	for i := range 5 {
		name := fmt.Sprintf("svc-%d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lbmodel.ClassL4),
				AllocateLoadBalancerNodePorts: ptr.To(i%2 == 0),
				SessionAffinity:               corev1.ServiceAffinityClientIP,
				Ports:                         []corev1.ServicePort{{Name: "http", Port: 80, NodePort: int32(30000 + i), Protocol: corev1.ProtocolTCP}},
			},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("10.96.240.%d", i+1)}}}},
		}
		if i%2 == 1 {
			svc.Spec.Ports[0].NodePort = 0
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		}
		for e := 3; e > 0; e-- {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", e, i+1)}, NodeName: ptr.To(fmt.Sprintf("node-%d", e))})
		}
		objs = append(objs, svc, slice)
	}
	reversed := make([]any, len(objs))
	for i, o := range objs {
		reversed[len(objs)-1-i] = o
	}
	var configs []dataplane.Config
	for _, order := range [][]any{objs, reversed} {
		s := &Syncer{Class: lbmodel.ClassL4, modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{}}
		svcs, slices, nodes := replicaView(t, order)
		cfg, _, _ := s.desired(logr.Discard(), svcs, slices, nodes)
		configs = append(configs, cfg)
	}
	if len(configs[0].Frontends) != 5 {
		t.Fatalf("%d frontends, want 5", len(configs[0].Frontends))
	}
	if !reflect.DeepEqual(configs[0], configs[1]) {
		t.Errorf("two replicas computed different configurations:\n%+v\n%+v", configs[0], configs[1])
	}
}
