package localcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster/nodeimage"
	"github.com/ebbdev/ebb/internal/localcluster/realnode"
)

// ClusterDNSIP is the cluster DNS Service's ClusterIP (Options.CoreDNS),
// the tenth of the Service range as kubeadm's is.
const ClusterDNSIP = "10.96.0.10"

// corefile serves the cluster's Services and pods by name, as kubeadm's
// does, without forwarding: the machine has no resolver to forward to.
const corefile = `.:53 {
    errors
    health :8080
    ready :8181
    kubernetes ` + realnode.ClusterDomain + ` in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loop
    reload
}
`

// startDNS runs CoreDNS in kube-system behind the kube-dns Service at
// ClusterDNSIP, as kubeadm deploys it (its image, named as upstream's, is
// imported into every node), and waits until it answers: its ready plugin
// is its readiness probe, so the Service has a Ready endpoint once it
// serves.
func (c *Cluster) startDNS(ctx context.Context) error {
	start := time.Now()
	labels := map[string]string{"k8s-app": "kube-dns"}
	ns := metav1.NamespaceSystem
	objects := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns"}}, metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "coredns", Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "coredns"},
				Data:       map[string]string{"Corefile": corefile},
			}, metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.Client.AppsV1().Deployments(ns).Create(ctx, coreDNSDeployment(labels), metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: labels},
				Spec: corev1.ServiceSpec{
					Selector:  labels,
					ClusterIP: ClusterDNSIP,
					Ports: []corev1.ServicePort{
						{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
						{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
					},
				},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objects {
		if err := create(ctx); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("deploying CoreDNS: %w", err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, "coredns", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas >= 1, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CoreDNS (kube-system/coredns) to be Ready, see kubectl -n kube-system describe pods -l k8s-app=kube-dns and the kubelet logs in %s: %w", filepath.Join(c.opts.Dir, "logs"), err)
	}
	c.progressf("cluster DNS (CoreDNS) at %s ready in %s", ClusterDNSIP, time.Since(start).Round(10*time.Millisecond))
	return nil
}

func coreDNSDeployment(labels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "coredns",
					// Its own name server is itself: resolve nothing
					// through the cluster DNS it serves.
					DNSPolicy: corev1.DNSDefault,
					Containers: []corev1.Container{{
						Name:            "coredns",
						Image:           nodeimage.CoreDNSRef,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
							PeriodSeconds: 1,
						},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}},
							FailureThreshold: 5, PeriodSeconds: 10, InitialDelaySeconds: 10,
						},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}}}}},
				},
			},
		},
	}
}
