// Package l2key provides the keys that sign ebb lb's L2 heartbeats: the
// Secret is created with one random key when it does not exist, so that a
// default install authenticates its L2 elections with no step of the
// user's. A Secret that exists is the user's (a rotation in progress, a key
// of their own) and is never changed.
package l2key

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// The create is granted for the webhook certificate already (a create
// cannot be limited to a name); reading is limited to this Secret.
// +kubebuilder:rbac:groups="",namespace=ebb-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=ebb-system,resources=secrets,verbs=get,resourceNames=ebb-l2-key

// FirstKeyID names the key a new Secret gets.
const FirstKeyID = "key-1"

// keyLen is the length of a generated key: 256 bits.
const keyLen = 32

// Ensure creates the Secret with one random key unless it exists. It
// reports whether it created it.
func Ensure(ctx context.Context, c client.Client, key client.ObjectKey) (bool, error) {
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	switch {
	case err == nil:
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("reading the L2 heartbeat key Secret %s: %w", key, err)
	}
	k := make([]byte, keyLen)
	if _, err := rand.Read(k); err != nil {
		return false, fmt.Errorf("generating an L2 heartbeat key: %w", err)
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "ebb"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{FirstKeyID: k},
	}
	switch err := c.Create(ctx, &s); {
	case err == nil:
		return true, nil
	case apierrors.IsAlreadyExists(err):
		return false, nil // another replica was first: its key stands
	default:
		return false, fmt.Errorf("creating the L2 heartbeat key Secret %s: %w", key, err)
	}
}

// retryAfter is the wait after a failed Ensure: until the Secret is there,
// no LB host owns an L2 address.
const retryAfter = 10 * time.Second

// Keeper runs Ensure at start and then every Period (a deleted Secret comes
// back with a new key), on every replica, leader or not.
type Keeper struct {
	// Client must not be a cached one (caches are not started for it).
	Client client.Client
	Secret client.ObjectKey
	Period time.Duration
}

var _ manager.Runnable = Keeper{}

// NeedLeaderElection: every replica keeps the Secret there.
func (k Keeper) NeedLeaderElection() bool { return false }

// Start ensures the Secret until ctx is done.
func (k Keeper) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("l2-key")
	for {
		wait := k.Period
		created, err := Ensure(ctx, k.Client, k.Secret)
		switch {
		case err != nil && ctx.Err() == nil:
			wait = min(wait, retryAfter)
			logger.Error(err, "Providing the L2 heartbeat key; retrying", "in", wait)
		case created:
			logger.Info("Created the L2 heartbeat key Secret with a random key", "secret", k.Secret)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
