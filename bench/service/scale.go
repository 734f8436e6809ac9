package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// scaleResult is what one ebb lb costs with many Services.
type scaleResult struct {
	services, endpoints int
	memoryMiB           float64
	fullResyncMs        float64
	readyAfter          time.Duration
}

// scale creates n selector-less LoadBalancer Services of three TCP ports,
// each with an EndpointSlice of perService endpoints spread over the nodes,
// waits until ebb lb serves all their frontends, then reads its resident
// memory and times full resyncs (triggered by touching a node).
func scale(ctx context.Context, c *localcluster.Cluster, lb lbReader, ns string, n, perService int, before float64) (scaleResult, error) {
	res := scaleResult{services: n, endpoints: n * perService}
	start := time.Now()
	for i := range n {
		name := fmt.Sprintf("scale-%d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{
				Type:              corev1.ServiceTypeLoadBalancer,
				LoadBalancerClass: ptr.To(lbmodel.ClassL4),
				Ports: []corev1.ServicePort{
					{Name: "a", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
					{Name: "b", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolTCP},
					{Name: "c", Port: 82, TargetPort: intstr.FromInt32(8082), Protocol: corev1.ProtocolTCP},
				},
			},
		}
		if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return res, fmt.Errorf("creating %s: %w", name, err)
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
				discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench-service",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		for _, p := range svc.Spec.Ports {
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(p.TargetPort.IntVal)})
		}
		for e := range perService {
			node := c.Nodes[e%len(c.Nodes)]
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.244.%d.%d", 100+(i*perService+e)/250, 1+(i*perService+e)%250)},
				NodeName:   ptr.To(node.Name),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			})
		}
		if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return res, fmt.Errorf("creating the slice of %s: %w", name, err)
		}
		if (i+1)%200 == 0 {
			fmt.Fprintf(os.Stderr, "  created %d of %d Services\n", i+1, n)
		}
	}
	want := before + float64(3*n)
	for {
		_, frontends, err := lb.syncFigures(ctx)
		if err == nil && frontends >= want {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return res, fmt.Errorf("ebb lb serves %.0f frontends after 10 minutes, want %.0f", frontends, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
	res.readyAfter = time.Since(start)

	// Full resyncs at this size: each node change recomputes and applies
	// everything.
	before0, err := lb.metrics(ctx)
	if err != nil {
		return res, err
	}
	sum0, count0 := before0["ebb_lbsync_sync_duration_seconds_sum"], before0["ebb_lbsync_sync_duration_seconds_count"]
	for i := range 10 {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, c.Nodes[0].Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if node.Annotations == nil {
				node.Annotations = map[string]string{}
			}
			node.Annotations["bench.ebb.dev/touch"] = fmt.Sprint(i)
			_, err = c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return res, err
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second)
	after, err := lb.metrics(ctx)
	if err != nil {
		return res, err
	}
	sum1, count1 := after["ebb_lbsync_sync_duration_seconds_sum"], after["ebb_lbsync_sync_duration_seconds_count"]
	if count1 > count0 {
		res.fullResyncMs = (sum1 - sum0) / (count1 - count0) * 1000
	}
	res.memoryMiB = after["process_resident_memory_bytes"] / (1 << 20)
	return res, nil
}
