package lbsync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/announce/bgp"
)

// +kubebuilder:rbac:groups=lb.ebb.dev,resources=bgppeers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=ebb-system,resources=secrets,verbs=get;list;watch

// PeerProblem is a BGPPeer that chooses this host but cannot be peered
// with, and why.
type PeerProblem struct {
	Address netip.Addr
	Message string
}

// BGPPeers follows the BGPPeer objects and says which routers this host
// peers with: those whose nodeSelector matches its Node, with the
// passwords of their Secrets.
type BGPPeers struct {
	// Cache holds BGPPeers, this host's Node and the Secrets of Namespace
	// labeled lbv1alpha1.PasswordSecretLabel=true; the caller starts it.
	Cache ctrlcache.Cache
	// Direct, when set, reads a password Secret the cache does not hold,
	// by name: a Secret written before ebb lb read only labeled ones keeps
	// its session across the upgrade, and the log says to label it.
	Direct client.Reader
	// Node is this host's Node (empty: only BGPPeers without a
	// nodeSelector choose it).
	Node string
	// Namespace holds the password Secrets.
	Namespace string
	// OnChange is told the peers, sorted by address, and the problems
	// whenever they change.
	OnChange func(peers []bgp.Peer, problems []PeerProblem)
}

// Run follows the BGPPeers until ctx is done.
func (b *BGPPeers) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("bgppeers")
	changed, err := watchAll(ctx, b.Cache, &lbv1alpha1.BGPPeer{}, &corev1.Node{}, &corev1.Secret{})
	if err != nil {
		return err
	}
	var lastPeers []bgp.Peer
	var lastProblems []PeerProblem
	var lastUnlabeled []string
	reported := false
	for {
		var retry <-chan time.Time
		peers, problems, unlabeled, err := b.read(ctx)
		switch {
		case err != nil:
			// The peers stay as they were; look again soon.
			log.Error(err, "Reading the BGP peers: keeping the sessions as they are")
			retry = time.After(readRetry)
		case !reported || !reflect.DeepEqual(peers, lastPeers) || !slices.Equal(problems, lastProblems):
			reported, lastPeers, lastProblems = true, peers, problems
			log.Info("BGP peers", "peers", peerAddresses(peers), "problems", problems)
			b.OnChange(peers, problems)
		}
		if err == nil {
			if len(unlabeled) > 0 && !slices.Equal(unlabeled, lastUnlabeled) {
				log.Info("Password Secrets without the label "+lbv1alpha1.PasswordSecretLabel+"=true are read one by one, and a change to them is seen late (at the next change of a BGPPeer, a labeled Secret or this host's Node): label them",
					"namespace", b.Namespace, "secrets", unlabeled,
					"command", fmt.Sprintf("kubectl -n %s label --overwrite secret %s %s=true", b.Namespace, strings.Join(unlabeled, " "), lbv1alpha1.PasswordSecretLabel))
			}
			lastUnlabeled = unlabeled
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry:
		}
	}
}

// readRetry is how soon the peers are read again after a failed read.
const readRetry = 10 * time.Second

// read returns the peers that choose this host, the problems, and the
// password Secrets read directly for want of the label.
func (b *BGPPeers) read(ctx context.Context) ([]bgp.Peer, []PeerProblem, []string, error) {
	var list lbv1alpha1.BGPPeerList
	if err := b.Cache.List(ctx, &list); err != nil {
		return nil, nil, nil, err
	}
	var node *corev1.Node
	if b.Node != "" {
		var n corev1.Node
		if err := b.Cache.Get(ctx, keyOf(b.Node), &n); err == nil {
			node = &n
		}
	}
	var unlabeled []string
	// A failed direct read is no answer: the peers stay as they were
	// (closing a live session for an API hiccup would withdraw its
	// routes until the next change).
	var directErr error
	secret := func(name string) (*corev1.Secret, error) {
		var s corev1.Secret
		key := client.ObjectKey{Namespace: b.Namespace, Name: name}
		err := b.Cache.Get(ctx, key, &s)
		if !apierrors.IsNotFound(err) {
			return &s, err
		}
		if b.Direct != nil {
			getCtx, cancel := context.WithTimeout(ctx, directReadTimeout)
			defer cancel()
			switch err := b.Direct.Get(getCtx, key, &s); {
			case err == nil:
				if !slices.Contains(unlabeled, name) {
					unlabeled = append(unlabeled, name)
				}
				return &s, nil
			case !apierrors.IsNotFound(err):
				directErr = errors.Join(directErr, fmt.Errorf("reading the password Secret %s/%s: %w", b.Namespace, name, err))
			}
		}
		return nil, fmt.Errorf("no Secret %s labeled %s=true (ebb lb reads no other Secret)", name, lbv1alpha1.PasswordSecretLabel)
	}
	peers, problems := SelectBGPPeers(node, list.Items, b.Namespace, secret)
	if directErr != nil {
		return nil, nil, nil, directErr
	}
	slices.Sort(unlabeled)
	return peers, problems, unlabeled, nil
}

// directReadTimeout bounds the read of one unlabeled password Secret.
const directReadTimeout = 10 * time.Second

// SelectBGPPeers returns the peers of the BGPPeers that choose node (nil:
// unknown, so only those without a nodeSelector), sorted by address, and
// the ones that choose it but cannot be used. Of two BGPPeers with one
// address, the first by name is used.
func SelectBGPPeers(node *corev1.Node, objs []lbv1alpha1.BGPPeer, namespace string, secret func(name string) (*corev1.Secret, error)) ([]bgp.Peer, []PeerProblem) {
	objs = slices.Clone(objs)
	slices.SortFunc(objs, func(a, b lbv1alpha1.BGPPeer) int { return strings.Compare(a.Name, b.Name) })
	var nodeLabels labels.Set
	if node != nil {
		nodeLabels = node.Labels
	}
	var peers []bgp.Peer
	var problems []PeerProblem
	byAddress := map[netip.Addr]string{}
	for _, o := range objs {
		addr, err := netip.ParseAddr(o.Spec.PeerAddress)
		if err != nil {
			continue // refused by the API's validation; nothing to report it under
		}
		addr = addr.Unmap()
		if o.Spec.NodeSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(o.Spec.NodeSelector)
			if err != nil {
				problems = append(problems, PeerProblem{addr, fmt.Sprintf("BGPPeer %s: invalid nodeSelector: %v", o.Name, err)})
				continue
			}
			if !sel.Matches(nodeLabels) {
				continue
			}
		}
		if first, ok := byAddress[addr]; ok {
			problems = append(problems, PeerProblem{addr, fmt.Sprintf("BGPPeer %s: BGPPeer %s already peers with %s from this host; delete one of them or give them nodeSelectors that do not overlap", o.Name, first, addr)})
			continue
		}
		byAddress[addr] = o.Name
		p, err := peerOf(o, addr, namespace, secret)
		if err != nil {
			problems = append(problems, PeerProblem{addr, err.Error()})
			continue
		}
		peers = append(peers, p)
	}
	slices.SortFunc(peers, func(a, b bgp.Peer) int { return a.Address.Compare(b.Address) })
	slices.SortFunc(problems, func(a, b PeerProblem) int { return a.Address.Compare(b.Address) })
	return peers, problems
}

func peerOf(o lbv1alpha1.BGPPeer, addr netip.Addr, namespace string, secret func(name string) (*corev1.Secret, error)) (bgp.Peer, error) {
	p := bgp.Peer{Address: addr, ASN: uint32(o.Spec.PeerASN), LocalASN: uint32(o.Spec.MyASN), Port: uint16(o.Spec.PeerPort)}
	if o.Spec.HoldTime != nil {
		p.HoldTime = o.Spec.HoldTime.Duration
	}
	if o.Spec.KeepaliveTime != nil {
		p.KeepaliveTime = o.Spec.KeepaliveTime.Duration
	}
	if o.Spec.GracefulRestart != nil && !*o.Spec.GracefulRestart {
		p.NoGracefulRestart = true
	}
	if ref := o.Spec.PasswordSecretRef; ref != nil {
		s, err := secret(ref.Name)
		if err != nil {
			return bgp.Peer{}, fmt.Errorf("BGPPeer %s: reading the password Secret %s/%s: %v", o.Name, namespace, ref.Name, err)
		}
		pw, ok := s.Data[lbv1alpha1.PasswordKey]
		if !ok || len(pw) == 0 {
			return bgp.Peer{}, fmt.Errorf("BGPPeer %s: the Secret %s/%s has no key %q holding the password", o.Name, namespace, ref.Name, lbv1alpha1.PasswordKey)
		}
		if len(pw) > 80 {
			return bgp.Peer{}, fmt.Errorf("BGPPeer %s: the password in Secret %s/%s is %d bytes; TCP MD5 allows at most 80", o.Name, namespace, ref.Name, len(pw))
		}
		p.Password = string(pw)
	}
	return p, nil
}

func peerAddresses(peers []bgp.Peer) []string {
	out := make([]string, len(peers))
	for i, p := range peers {
		out[i] = p.Address.String()
	}
	return out
}
