package lbsync

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
)

// readerCache is a cache that only reads, from a client.
type readerCache struct {
	ctrlcache.Cache
	client.Reader
}

func (c readerCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c readerCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.Reader.List(ctx, list, opts...)
}

// A password comes from a Secret labeled as one, which ebb lb's cache
// holds. An unlabeled one (written before ebb lb cached only labeled
// Secrets) is read directly, so that its session survives the upgrade,
// and is named so that the log can say to label it; without the direct
// reader, the peer's problem says what is missing.
func TestPasswordSecrets(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := lbv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	secret := func(name string, labeled bool) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ebb-system", Name: name}, Data: map[string][]byte{"password": []byte("pw-" + name)}}
		if labeled {
			s.Labels = map[string]string{lbv1alpha1.PasswordSecretLabel: "true"}
		}
		return s
	}
	peer := func(name, addr, secret string) *lbv1alpha1.BGPPeer {
		return &lbv1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.BGPPeerSpec{
			PeerAddress: addr, PeerASN: 64500, MyASN: 64512, PasswordSecretRef: &lbv1alpha1.SecretReference{Name: secret}}}
	}
	labeled, unlabeled := secret("labeled", true), secret("unlabeled", false)
	peers := []client.Object{peer("a", "10.0.0.1", "labeled"), peer("b", "10.0.0.2", "unlabeled"), peer("c", "10.0.0.3", "missing")}
	// The cache, as ebb lb scopes it, holds the labeled Secret only.
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(slices.Clone(peers), labeled)...).Build()
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(labeled, unlabeled).Build()

	// A direct read that fails (not for want of the Secret) is no
	// answer: read returns the error and the sessions stay as they are.
	failing := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).Build(), interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewServiceUnavailable("the API server is restarting")
		},
	})
	b := &BGPPeers{Cache: readerCache{Reader: cached}, Direct: failing, Namespace: "ebb-system"}
	if _, _, _, err := b.read(context.Background()); err == nil || !strings.Contains(err.Error(), "reading the password Secret ebb-system/unlabeled: the API server is restarting") {
		t.Errorf("a failing direct read: %v, want its error", err)
	}

	for _, c := range []struct {
		name          string
		direct        client.Reader
		wantPasswords string
		wantUnlabeled []string
		wantProblems  []string
	}{
		{"with the direct reader", api, "10.0.0.1=pw-labeled 10.0.0.2=pw-unlabeled", []string{"unlabeled"},
			[]string{"10.0.0.3: BGPPeer c: reading the password Secret ebb-system/missing: no Secret missing labeled lb.ebb.dev/bgp-password=true (ebb lb reads no other Secret)"}},
		{"without", nil, "10.0.0.1=pw-labeled", nil, []string{
			"10.0.0.2: BGPPeer b: reading the password Secret ebb-system/unlabeled: no Secret unlabeled labeled lb.ebb.dev/bgp-password=true (ebb lb reads no other Secret)",
			"10.0.0.3: BGPPeer c: reading the password Secret ebb-system/missing: no Secret missing labeled lb.ebb.dev/bgp-password=true (ebb lb reads no other Secret)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &BGPPeers{Cache: readerCache{Reader: cached}, Direct: c.direct, Namespace: "ebb-system"}
			got, problems, unlabeled, err := b.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var passwords, gotProblems []string
			for _, p := range got {
				passwords = append(passwords, fmt.Sprintf("%s=%s", p.Address, p.Password))
			}
			for _, p := range problems {
				gotProblems = append(gotProblems, fmt.Sprintf("%s: %s", p.Address, p.Message))
			}
			if strings.Join(passwords, " ") != c.wantPasswords {
				t.Errorf("passwords %v, want %s", passwords, c.wantPasswords)
			}
			if !slices.Equal(unlabeled, c.wantUnlabeled) {
				t.Errorf("unlabeled %v, want %v", unlabeled, c.wantUnlabeled)
			}
			if !slices.Equal(gotProblems, c.wantProblems) {
				t.Errorf("problems\n%s\nwant\n%s", strings.Join(gotProblems, "\n"), strings.Join(c.wantProblems, "\n"))
			}
		})
	}
}
