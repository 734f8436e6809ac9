package charts_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// helmOnlyAnnotations are what the chart adds and config/ has no use
// for: CRDs kept at uninstall, and the leaving signals' checksum that
// rolls the pods reading them when they change.
var helmOnlyAnnotations = []string{"helm.sh/resource-policy", "checksum/leaving-signals"}

// comparable returns objs by key, without what only one side has: the
// Namespace (helm install --create-namespace makes it), Helm's hooks
// (helm uninstall's clean-up, which kubectl delete has no place for) and
// the annotations of helmOnlyAnnotations.
func comparable(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		if _, hook := o.GetAnnotations()["helm.sh/hook"]; hook || o.GetKind() == "Namespace" {
			continue
		}
		o = o.DeepCopy()
		dropAnnotations(o.Object, "metadata", "annotations")
		dropAnnotations(o.Object, "spec", "template", "metadata", "annotations")
		k := key(o)
		if _, dup := out[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		out[k] = o.Object
	}
	return out
}

// dropAnnotations removes helmOnlyAnnotations from the map at path of
// obj, and the map when it is left empty.
func dropAnnotations(obj map[string]any, path ...string) {
	a, found, _ := unstructured.NestedStringMap(obj, path...)
	if !found {
		return
	}
	for _, k := range helmOnlyAnnotations {
		delete(a, k)
	}
	if len(a) == 0 {
		unstructured.RemoveNestedField(obj, path...)
		return
	}
	_ = unstructured.SetNestedStringMap(obj, a, path...)
}

// For every choice that config/ offers as an overlay or a component, the
// chart with the matching values renders the same objects: one source of
// truth, whichever way a user installs.
func TestChartRendersWhatConfigRenders(t *testing.T) {
	for _, tc := range []struct {
		name string
		// set are the chart's values (helm --set).
		set []string
		// overlay is a directory of config/ (else config/default), with
		// components of config/components.
		overlay    string
		components []string
	}{
		{name: "defaults"},
		{name: "cert-manager", set: []string{"webhook.certManager.enabled=true"}, overlay: "cert-manager"},
		{name: "eBPF path", set: []string{"lb.kernelPath=ebpf"}, components: []string{"kernel-ebpf"}},
		{name: "eviction guard", set: []string{"evictionGuard.enabled=true"}, components: []string{"eviction-guard"}},
		{name: "webhook client authentication", set: []string{"webhook.clientAuth.enabled=true"}, components: []string{"webhook-client-auth"}},
		{name: "alert rules", set: []string{"monitoring.prometheusRule.enabled=true"}, components: []string{"monitoring"}},
		{name: "ServiceMonitor", set: []string{"monitoring.serviceMonitor.enabled=true"}, components: []string{"servicemonitor"}},
		{name: "dashboards", set: []string{"monitoring.dashboards.enabled=true"}, components: []string{"dashboards"}},
		{name: "Azure configuration Secret", set: []string{"azure.enabled=true"}, components: []string{"azure-config-secret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := comparable(t, renderKustomize(t, tc.overlay, tc.components...))
			got := comparable(t, renderHelm(t, "ebb-system", tc.set...))
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if _, ok := got[k]; !ok {
					t.Errorf("the chart does not render %s", k)
					continue
				}
				if d := cmp.Diff(want[k], got[k]); d != "" {
					t.Errorf("%s differs (-config +chart):\n%s", k, d)
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[k]; !ok {
					t.Errorf("the chart renders %s, config/ does not", k)
				}
			}
		})
	}
}

// The values that only the chart offers (config/ leaves them to the
// user's own patches) do what docs/helm.md says.
func TestChartValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		set       []string
		check     func(t *testing.T, objs []*unstructured.Unstructured)
	}{{
		name: "default load balancer on the controller and ebb lb",
		set:  []string{"defaultLoadBalancer=true"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			wantArg(t, objs, "Deployment", "ebb-controller", "--default-load-balancer")
			wantArg(t, objs, "DaemonSet", "ebb-lb", "--default-load-balancer")
		},
	}, {
		name: "engine, kernel path and L2 interfaces",
		set:  []string{"lb.engine=Kernel", "lb.kernelPath=nftables", "lb.l2Interfaces={eth1,eth2}"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, a := range []string{"--engine=Kernel", "--kernel-path=nftables", "--l2-interface=eth1", "--l2-interface=eth2"} {
				wantArg(t, objs, "DaemonSet", "ebb-lb", a)
			}
			if caps := strings.Join(strings.Fields(field(t, objs, "DaemonSet", "ebb-lb", "spec", "template", "spec", "containers", "0", "securityContext", "capabilities", "add")), " "); strings.Contains(caps, "BPF") {
				t.Errorf("the nftables path got CAP_BPF: %s", caps)
			}
		},
	}, {
		name: "load-balancer hosts: node selector and more tolerations",
		set:  []string{"lb.nodeSelector.role=edge", "lb.tolerations[0].key=dedicated", "lb.tolerations[0].operator=Exists"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := field(t, objs, "DaemonSet", "ebb-lb", "spec", "template", "spec", "nodeSelector"); got != "map[ebb.dev/load-balancer:true role:edge]" {
				t.Errorf("nodeSelector %s, want the default's and role=edge", got)
			}
			tol := field(t, objs, "DaemonSet", "ebb-lb", "spec", "template", "spec", "tolerations")
			for _, k := range []string{"ebb.dev/draining", "node.kubernetes.io/out-of-service", "dedicated"} {
				if !strings.Contains(tol, "key:"+k) {
					t.Errorf("tolerations %s lack %s", tol, k)
				}
			}
		},
	}, {
		name: "controller replicas, resources and image by digest",
		set:  []string{"controller.replicas=3", "controller.resources.limits.memory=1Gi", "image.repository=registry.example/ebb", "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := field(t, objs, "Deployment", "ebb-controller", "spec", "replicas"); got != "3" {
				t.Errorf("replicas %s, want 3", got)
			}
			if got := field(t, objs, "Deployment", "ebb-controller", "spec", "template", "spec", "containers", "0", "resources", "limits", "memory"); got != "1Gi" {
				t.Errorf("memory limit %s, want 1Gi", got)
			}
			for _, w := range []struct{ kind, name string }{{"Deployment", "ebb-controller"}, {"DaemonSet", "ebb-lb"}, {"DaemonSet", "ebb-node-agent"}} {
				if got := field(t, objs, w.kind, w.name, "spec", "template", "spec", "containers", "0", "image"); got != "registry.example/ebb@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
					t.Errorf("%s %s's image %s, want the digest", w.kind, w.name, got)
				}
			}
		},
	}, {
		name:      "another namespace",
		namespace: "lb-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				// A CRD's field descriptions name the default namespace.
				if o.GetKind() != "CustomResourceDefinition" && strings.Contains(dump(o), "ebb-system") {
					t.Errorf("%s still names ebb-system", key(o))
				}
			}
			// The flags that name ebb's own objects default to the pod's namespace.
			if env := field(t, objs, "Deployment", "ebb-controller", "spec", "template", "spec", "containers", "0", "env"); !strings.Contains(env, "name:POD_NAMESPACE valueFrom:map[fieldRef:map[fieldPath:metadata.namespace]]") {
				t.Errorf("the controller is not told its namespace: %s", env)
			}
			wantArg(t, objs, "Deployment", "ebb-controller", "--leader-election-namespace=lb-system")
			if got := dump(find(objs, "ValidatingAdmissionPolicy", "ebb-controller-node-writes")); !strings.Contains(got, "system:serviceaccount:lb-system:ebb-controller") {
				t.Errorf("the admission policy does not name the controller of lb-system: %s", got)
			}
		},
	}, {
		name: "without the CRDs and the node-agent",
		set:  []string{"crds.install=false", "nodeAgent.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" || o.GetName() == "ebb-node-agent" && o.GetKind() == "DaemonSet" {
					t.Errorf("rendered %s", key(o))
				}
			}
		},
	}, {
		name: "cert-manager with an issuer of the user's",
		set:  []string{"webhook.certManager.enabled=true", "webhook.certManager.issuerRef.kind=ClusterIssuer", "webhook.certManager.issuerRef.name=corp-ca"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if find(objs, "Issuer", "ebb-selfsigned") != nil {
				t.Error("made a self-signed Issuer although the user named one")
			}
			if got := field(t, objs, "Certificate", "ebb-webhook-cert", "spec", "issuerRef"); got != "map[kind:ClusterIssuer name:corp-ca]" {
				t.Errorf("issuerRef %s", got)
			}
		},
	}, {
		name: "cert-manager injects the eviction guard's CA too",
		set:  []string{"webhook.certManager.enabled=true", "evictionGuard.enabled=true"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, name := range []string{"ebb-validating-webhook-configuration", "ebb-eviction-guard"} {
				if got := field(t, objs, "ValidatingWebhookConfiguration", name, "metadata", "annotations"); got != "map[cert-manager.io/inject-ca-from:ebb-system/ebb-webhook-cert]" {
					t.Errorf("%s's annotations: %s", name, got)
				}
			}
		},
	}, {
		name: "another load-balancer class, for the clean-up too",
		set:  []string{"loadBalancerClass=example.com/lb"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, w := range []struct{ kind, name string }{{"Deployment", "ebb-controller"}, {"DaemonSet", "ebb-lb"}, {"Job", "ebb-uninstall"}} {
				wantArg(t, objs, w.kind, w.name, "--load-balancer-class=example.com/lb")
			}
		},
	}, {
		name: "the scraper's service account bound to read the metrics",
		set:  []string{"monitoring.metricsReader=monitoring/prometheus-k8s", "lb.metricsPort=19474", "monitoring.serviceMonitor.enabled=true"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := field(t, objs, "ClusterRoleBinding", "ebb-metrics-reader", "subjects"); got != "[map[kind:ServiceAccount name:prometheus-k8s namespace:monitoring]]" {
				t.Errorf("subjects %s", got)
			}
			wantArg(t, objs, "DaemonSet", "ebb-lb", "--secure-metrics-bind-address=$(NODE_IP):19474")
			if got := field(t, objs, "Service", "ebb-lb-metrics", "spec", "ports"); got != "[map[name:https-metrics port:19474 targetPort:19474]]" {
				t.Errorf("ebb-lb-metrics ports %s", got)
			}
		},
	}, {
		name: "no leaving signal but ebb's own",
		set:  []string{"leavingSignals="},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := find(objs, "ConfigMap", "ebb-leaving-signals"); got == nil || strings.TrimSpace(formatValue(got.Object["data"].(map[string]any)["signals"])) != "" {
				t.Errorf("want the ConfigMap with no signal (else the components fall back to the default list): %s", dump(got))
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.namespace
			if ns == "" {
				ns = "ebb-system"
			}
			tc.check(t, renderHelm(t, ns, tc.set...))
		})
	}
}

// Changing the leaving signals changes the pods of the three components
// that read them at start, so that an upgrade rolls them.
func TestLeavingSignalsChangeRollsTheirReaders(t *testing.T) {
	before := renderHelm(t, "ebb-system")
	after := renderHelm(t, "ebb-system", "leavingSignals=taint:example.com/leaving")
	for _, w := range []struct{ kind, name string }{{"Deployment", "ebb-controller"}, {"DaemonSet", "ebb-lb"}, {"DaemonSet", "ebb-node-agent"}} {
		b := field(t, before, w.kind, w.name, "spec", "template", "metadata", "annotations")
		a := field(t, after, w.kind, w.name, "spec", "template", "metadata", "annotations")
		if a == b {
			t.Errorf("%s %s's pod template is the same with other leaving signals: %s", w.kind, w.name, a)
		}
	}
	if got := field(t, after, "ConfigMap", "ebb-leaving-signals", "data", "signals"); got != "taint:example.com/leaving\n" {
		t.Errorf("signals %q", got)
	}
}

// Values that cannot work are refused before anything is installed, with
// a message that says what to write.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"lb.engine=Fast", "Proxy"},
		{"lb.kernelPath=xdp", "ebpf"},
		{"controller.replicas=0", "minimum"},
		{"azure.enabled=true,azure.configSecret=azure-cloud-provider", "NAMESPACE/NAME"},
		{"image.digest=abc", "sha256:"},
		// A misspelt value is refused rather than ignored.
		{"lb.nodeSelectr.role=edge", "nodeSelectr"},
		{"monitoring.metricsReader=prometheus", "NAMESPACE/NAME"},
		{"monitoring.metricsReader=monitoring/", "NAMESPACE/NAME"},
		{"lb.metricsPort=10266", "must differ"},
		{"imagePullSecrets[0]=regcred", "imagePullSecrets"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := helm(t, templateArgs("ebb-system", tc.set)...)
			if err == nil {
				t.Fatalf("helm template --set %s: no error", tc.set)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template --set %s: the error does not say %q:\n%v", tc.set, tc.want, err)
			}
		})
	}
}

// helm lint finds nothing wrong, with the defaults and with every option
// on.
func TestChartLints(t *testing.T) {
	for _, set := range []string{"", "webhook.certManager.enabled=true,evictionGuard.enabled=true,azure.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.serviceMonitor.enabled=true,monitoring.metricsReader=monitoring/prometheus,monitoring.dashboards.enabled=true,lb.kernelPath=ebpf,defaultLoadBalancer=true"} {
		args := []string{"lint", "--strict", chartDir}
		if set != "" {
			args = append(args, "--set", set)
		}
		if out, err := helm(t, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// wantArg fails t unless the first container of kind/name has arg.
func wantArg(t *testing.T, objs []*unstructured.Unstructured, kind, name, arg string) {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		t.Fatalf("%s %s has no container", kind, name)
	}
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !slices.Contains(args, arg) {
		t.Errorf("%s %s's arguments %q lack %s", kind, name, args, arg)
	}
}

// field returns the value at path of kind/name (a number in path indexes
// a list) formatted with %v, failing t when there is none.
func field(t *testing.T, objs []*unstructured.Unstructured, kind, name string, path ...string) string {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	var v any = o.Object
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i := int(p[0] - '0')
			if len(p) != 1 || i >= len(x) {
				t.Fatalf("%s %s: no item %s at %v", kind, name, p, path)
			}
			v = x[i]
		default:
			t.Fatalf("%s %s: nothing at %v", kind, name, path)
		}
	}
	if v == nil {
		t.Fatalf("%s %s: nothing at %v", kind, name, path)
	}
	return formatValue(v)
}
