// Package uninstall implements `ebb uninstall`: what removing ebb's
// workloads leaves in the cluster, taken away once ebb's controller is
// gone. The Helm chart runs it as a post-delete hook (docs/helm.md).
package uninstall

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/cmd/podns"
	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Options are `ebb uninstall`'s flags.
type Options struct {
	Kubeconfig string
	// Class is the load-balancer class ebb served.
	Class string
	// Namespace and ControllerSelector find ebb controller's pods, which
	// must be gone first: a running controller would serve the Services
	// again.
	Namespace          string
	ControllerSelector string
	// Timeout bounds the wait for the controller's pods.
	Timeout time.Duration
}

// NewCommand returns `ebb uninstall`.
func NewCommand() *cobra.Command {
	o := &Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Release the Services ebb served, once ebb's controller is removed",
		Long: `Release the Services ebb served, once ebb's controller is removed: each
LoadBalancer Service that ebb marked as its own (or of ebb's class) loses
the addresses in its status, ebb's conditions and the cleanup finalizer,
which would otherwise hold its deletion forever. It first waits until no
pod of ebb controller is left (--timeout), so that none serves them again.
Run after removing ebb's workloads; the Helm chart runs it as a
post-delete hook. The CRDs and their objects (AddressPools,
NodeMaintenances) are not touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := logr.NewContext(cmd.Context(), zap.New(zap.UseFlagOptions(&zapOpts)))
			return o.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&o.Class, "load-balancer-class", lbmodel.ClassL4, "spec.loadBalancerClass of the Services ebb served")
	f.StringVar(&o.Namespace, "namespace", podns.Namespace(), "namespace ebb controller ran in (default: $POD_NAMESPACE, else ebb-system)")
	f.StringVar(&o.ControllerSelector, "controller-selector", "app.kubernetes.io/name=ebb-controller", "label selector of ebb controller's pods")
	f.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long to wait for ebb controller's pods to go")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}

// Run waits for the controller's pods to go, then releases every Service
// ebb served.
func (o *Options) Run(ctx context.Context) error {
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("making the client's scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("making a client: %w", err)
	}
	if err := waitControllerGone(ctx, c, o.Namespace, o.ControllerSelector, o.Timeout); err != nil {
		return err
	}
	return ReleaseServices(ctx, c, o.Class)
}

// waitControllerGone polls until no pod of selector is left in namespace.
func waitControllerGone(ctx context.Context, c client.Client, namespace, selector string, timeout time.Duration) error {
	sel, err := labels.Parse(selector)
	if err != nil {
		return fmt.Errorf("--controller-selector %q: %w", selector, err)
	}
	var left []string
	var listErr error
	err = wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if listErr = c.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: sel}); listErr != nil {
			return false, nil // an API server restarting: try again
		}
		left = left[:0]
		for _, p := range pods.Items {
			left = append(left, p.Name)
		}
		return len(left) == 0, nil
	})
	switch {
	case err == nil:
		return nil
	case listErr != nil:
		return fmt.Errorf("listing ebb controller's pods in %s: %w", namespace, listErr)
	default:
		return fmt.Errorf("ebb controller's pods %v in %s are still there (remove ebb's Deployment first; a running controller serves the Services again): %w", left, namespace, err)
	}
}

// ReleaseServices forgets every Service ebb served (service.Forget):
// those holding the cleanup finalizer that are marked as served by class
// or ask for class. A Service of another implementation is never touched.
// Every Service is tried; the errors are joined.
func ReleaseServices(ctx context.Context, c client.Client, class string) error {
	logger := logr.FromContextOrDiscard(ctx)
	var list corev1.ServiceList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	var errs []error
	released := 0
	for i := range list.Items {
		svc := &list.Items[i]
		if !servedBy(svc, class) {
			continue
		}
		if err := forget(ctx, c, svc, class); err != nil {
			errs = append(errs, err)
			continue
		}
		released++
		logger.Info("Released the Service's load balancer", "service", klog.KObj(svc))
	}
	logger.Info("Released the Services ebb served", "released", released, "failed", len(errs))
	return errors.Join(errs...)
}

// forget is service.Forget, read again and retried when another writer
// changed svc meanwhile (the list may be stale).
func forget(ctx context.Context, c client.Client, svc *corev1.Service, class string) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := c.Get(ctx, client.ObjectKeyFromObject(svc), svc); apierrors.IsNotFound(err) {
				return nil
			} else if err != nil {
				return fmt.Errorf("reading Service %s again: %w", klog.KObj(svc), err)
			}
			if !servedBy(svc, class) {
				return nil
			}
		}
		first = false
		return service.Forget(ctx, c, svc)
	})
}

// servedBy reports whether ebb of class served svc: it holds the cleanup
// finalizer and is marked as class's or asks for class. The finalizer
// alone says nothing: it is KEP-1959's, shared by every implementation.
func servedBy(svc *corev1.Service, class string) bool {
	if !slices.Contains(svc.Finalizers, lbmodel.CleanupFinalizer) {
		return false
	}
	return svc.Annotations[lbmodel.ServedByAnnotation] == class ||
		svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass == class
}
