package ebbrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// LBNodeLabel marks the nodes that run ebb lb (config/lb's nodeSelector).
const LBNodeLabel = "ebb.dev/load-balancer"

// ManifestOptions say what a user would change in dist/install.yaml before
// applying it on the local cluster.
type ManifestOptions struct {
	// VIPPools are the CIDRs of the AddressPool created (default: the
	// local cluster's VIPCIDR and VIPCIDRv6).
	VIPPools []string
	// LBNodes are labelled to run ebb lb.
	LBNodes []string
	// ControllerArgs and LBArgs are added to the controller's and ebb lb's
	// arguments.
	ControllerArgs, LBArgs []string
	// EditController, if set, edits the controller's Deployment further
	// (volumes, environment), as a user's kustomize patch would.
	EditController func(*appsv1.Deployment)
	// EditLB, if set, edits ebb lb's DaemonSet further (tolerations).
	EditLB func(*appsv1.DaemonSet)
}

// InstallManifest installs ebb as a user does, from dist/install.yaml (its
// pods run ebb's image: start the cluster with the image layout in
// Options.Images): it labels the LB nodes, applies the manifest with
// kubectl, waits until the controller replicas are Ready, the webhook has
// its CA and ebb lb is Ready on every LB node, and creates an AddressPool
// of the VIP pool.
func InstallManifest(ctx context.Context, c *localcluster.Cluster, manifest string, opts ManifestOptions) error {
	if len(opts.VIPPools) == 0 {
		opts.VIPPools = []string{localcluster.VIPCIDR.String(), localcluster.VIPCIDRv6.String()}
	}
	data, err := os.ReadFile(manifest)
	if err != nil {
		return fmt.Errorf("reading %s (make release writes it): %w", manifest, err)
	}
	edited, err := editManifest(data, opts)
	if err != nil {
		return fmt.Errorf("editing %s: %w", manifest, err)
	}
	path := filepath.Join(c.Dir(), "install.yaml")
	if err := os.WriteFile(path, edited, 0o644); err != nil {
		return err
	}
	for _, n := range opts.LBNodes {
		if err := SetLBNode(ctx, c, n, true); err != nil {
			return err
		}
	}
	if err := kubectlApply(ctx, c, path); err != nil {
		return err
	}
	if err := WaitInstalled(ctx, c, len(opts.LBNodes)); err != nil {
		return err
	}
	// Then the addresses, as a user does once the CRDs are in.
	pools, err := json.Marshal(opts.VIPPools)
	if err != nil {
		return err
	}
	return ApplyYAML(ctx, c, "addresspool", fmt.Sprintf("apiVersion: lb.ebb.dev/v1alpha1\nkind: AddressPool\nmetadata:\n  name: %s\nspec:\n  addresses: %s\n", DefaultPoolName, pools))
}

// ApplyYAML applies a manifest (YAML documents) with kubectl, as a user
// does; name names the file it is written to in the cluster's directory.
func ApplyYAML(ctx context.Context, c *localcluster.Cluster, name, manifest string) error {
	path := filepath.Join(c.Dir(), name+".yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return kubectlApply(ctx, c, path)
}

// DefaultPoolName names the AddressPool InstallManifest creates.
const DefaultPoolName = "default"

// kubectlApply runs kubectl apply --server-side -f path on the cluster.
func kubectlApply(ctx context.Context, c *localcluster.Cluster, path string) error {
	kubectl := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", c.Kubeconfig, "apply", "--server-side", "-f", path)
	if out, err := kubectl.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply -f %s: %w\n%s", path, err, out)
	}
	return nil
}

// editManifest adds arguments to the controller and ebb lb, as a kustomize
// patch of a user's would.
func editManifest(data []byte, opts ManifestOptions) ([]byte, error) {
	var out bytes.Buffer
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return nil, err
		}
		if obj.Object == nil {
			continue
		}
		if obj.GetKind() == "Deployment" && obj.GetName() == "ebb-controller" {
			if err := editArgs(obj, func(args []string) []string { return append(args, opts.ControllerArgs...) }); err != nil {
				return nil, err
			}
			if opts.EditController != nil {
				if err := editTyped(obj, opts.EditController); err != nil {
					return nil, err
				}
			}
		}
		if obj.GetKind() == "DaemonSet" && obj.GetName() == "ebb-lb" {
			if err := editArgs(obj, func(args []string) []string { return append(args, opts.LBArgs...) }); err != nil {
				return nil, err
			}
			if opts.EditLB != nil {
				if err := editTyped(obj, opts.EditLB); err != nil {
					return nil, err
				}
			}
		}
		y, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(y)
	}
	return out.Bytes(), nil
}

// editTyped edits a workload held as unstructured through its typed form
// (T is appsv1.Deployment or appsv1.DaemonSet).
func editTyped[T any](obj *unstructured.Unstructured, edit func(*T)) error {
	typed := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, typed); err != nil {
		return fmt.Errorf("reading %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	edit(typed)
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return fmt.Errorf("writing %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	// The typed round trip adds empty fields (status, creationTimestamp)
	// that a server-side apply must not own.
	delete(out, "status")
	unstructured.RemoveNestedField(out, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(out, "spec", "template", "metadata", "creationTimestamp")
	obj.Object = out
	return nil
}

// editArgs edits the arguments of a workload's first container.
func editArgs(obj *unstructured.Unstructured, edit func([]string) []string) error {
	containers, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		return fmt.Errorf("%s %s has no containers", obj.GetKind(), obj.GetName())
	}
	first := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(first, "args")
	if err := unstructured.SetNestedStringSlice(first, edit(args), "args"); err != nil {
		return err
	}
	return unstructured.SetNestedSlice(obj.Object, containers, "spec", "template", "spec", "containers")
}

// WaitInstalled waits for ebb installed by InstallManifest to be ready:
// every controller replica Ready, the webhook configurations carrying the
// controller's CA, and ebb lb Ready on lbNodes nodes.
func WaitInstalled(ctx context.Context, c *localcluster.Cluster, lbNodes int) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, "ebb-controller", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if !deploymentReady(d) {
			last = fmt.Sprintf("ebb-controller: %d of %d replicas ready", d.Status.ReadyReplicas, ptrValue(d.Spec.Replicas))
			return false, nil
		}
		v, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, validatingConfiguration, metav1.GetOptions{})
		if err != nil || len(v.Webhooks) == 0 || len(v.Webhooks[0].ClientConfig.CABundle) == 0 {
			last = "the validating webhook has no CA yet"
			return false, nil
		}
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, "ebb-lb", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if int(ds.Status.NumberReady) < lbNodes {
			last = fmt.Sprintf("ebb-lb: %d of %d ready", ds.Status.NumberReady, lbNodes)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		where := "pod logs in " + filepath.Join(c.Dir(), "logs", "pods")
		if c.RealKubelets() {
			where = "pod logs by kubectl logs -n " + Namespace
		}
		return fmt.Errorf("waiting for ebb to be installed (%s; %s): %w", last, where, err)
	}
	return nil
}

func deploymentReady(d *appsv1.Deployment) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas == ptrValue(d.Spec.Replicas) && d.Status.UpdatedReplicas == ptrValue(d.Spec.Replicas)
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// FindManifest returns the manifest to install ebb from: path if given,
// else $EBB_DIST/install.yaml, else dist/install.yaml beside the bin
// directory this binary is in (a checkout's bin/ebb). The image layout
// (oci/) sits beside it. The error says how to make one.
func FindManifest(path string) (string, error) {
	if path == "" {
		if dist := os.Getenv("EBB_DIST"); dist != "" {
			path = filepath.Join(dist, "install.yaml")
		} else if self, err := os.Executable(); err == nil {
			path = filepath.Join(filepath.Dir(filepath.Dir(self)), "dist", "install.yaml")
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("ebb is installed from %s and its image layout beside it: run `make release` or give the manifest's path: %w", abs, err)
	}
	return abs, nil
}
