package lbsync

import (
	"context"
	"fmt"

	"k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// watchAll watches objs in c and returns a channel that is signalled
// (without blocking, coalesced) when any of them changes, once c synced.
func watchAll(ctx context.Context, c ctrlcache.Cache, objs ...client.Object) (<-chan struct{}, error) {
	changed := make(chan struct{}, 1)
	kick := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { kick() }, UpdateFunc: func(any, any) { kick() }, DeleteFunc: func(any) { kick() }}
	for _, obj := range objs {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("watching %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the caches of %d kinds did not sync", len(objs))
	}
	return changed, nil
}
