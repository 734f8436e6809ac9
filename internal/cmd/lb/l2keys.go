package lb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/ebbdev/ebb/internal/announce/l2"
	"github.com/ebbdev/ebb/internal/cmd/podns"
)

// defaultL2KeySecret is the Secret of the L2 heartbeat keys: the
// controller creates it with one random key (docs/l2.md).
func defaultL2KeySecret() string { return podns.Namespace() + "/ebb-l2-key" }

// followL2Keys keeps the L2 heartbeat keys from --l2-key-dir (re-read
// every l2KeyDirEvery) or else the --l2-key-secret Secret, watched through
// client (nil without a cluster), until ctx is done. Keys that do not parse
// are reported and the last good ones kept: an edit in progress must not
// silence every replica.
func (o *Options) followL2Keys(ctx context.Context, log logr.Logger, sinks *addressSinks, client kubernetes.Interface) error {
	log = log.WithName("l2-keys")
	var last string
	use := func(from string, data map[string][]byte) {
		k, err := l2.ParseKeys(data)
		if err != nil {
			if msg := err.Error(); msg != last {
				last = msg
				log.Error(err, "The L2 heartbeat keys are not usable: keeping the last good ones (none: no L2 address is owned)", "from", from)
			}
			return
		}
		last = ""
		sinks.setL2Keys(k)
	}
	if o.L2KeyDir != "" {
		for {
			data, err := readKeyDir(o.L2KeyDir)
			if err != nil {
				data = nil
				log.Error(err, "Reading the L2 heartbeat keys", "dir", o.L2KeyDir)
			}
			use(o.L2KeyDir, data)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(l2KeyDirEvery):
			}
		}
	}
	if client == nil || o.L2KeySecret == "" {
		if len(o.L2.Interfaces) > 0 {
			// No cluster, or no Secret named: no key will come.
			log.Error(nil, "L2 announcement without heartbeat keys owns no address: give --l2-key-dir (or, with a cluster, --l2-key-secret)")
		}
		return nil
	}
	ns, name, ok := strings.Cut(o.L2KeySecret, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--l2-key-secret %q: want namespace/name", o.L2KeySecret)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().Secrets().Informer()
	from := "Secret " + o.L2KeySecret
	onSecret := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			use(from, s.Data)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onSecret,
		UpdateFunc: func(_, obj any) { onSecret(obj) },
		DeleteFunc: func(any) {
			log.Info("The L2 heartbeat key Secret was deleted: keeping its keys until it is back", "secret", o.L2KeySecret)
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	if len(inf.GetStore().List()) == 0 && ctx.Err() == nil {
		log.Info("Waiting for the L2 heartbeat key Secret (the controller creates it): until then no L2 address is owned", "secret", o.L2KeySecret)
	}
	<-ctx.Done()
	f.Shutdown()
	return nil
}

// l2KeyDirEvery is how often --l2-key-dir is read again (a mounted Secret
// changes under it).
const l2KeyDirEvery = 10 * time.Second

// readKeyDir reads a directory laid out as a mounted Secret: a file per
// field, hidden entries (the kubelet's ..data links) skipped.
func readKeyDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		data[e.Name()] = b
	}
	return data, nil
}

// startL2Keys runs followL2Keys beside the caller (client: nil without a
// cluster).
func (o *Options) startL2Keys(ctx context.Context, log logr.Logger, sinks *addressSinks, client kubernetes.Interface) {
	go func() {
		if err := o.followL2Keys(ctx, log, sinks, client); err != nil {
			log.Error(err, "Following the L2 heartbeat keys: no L2 address is owned")
		}
	}()
}
