package announce_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A BGPPeer that chooses one LB host but whose password Secret does not
// exist keeps that host's session closed, and its status says so, naming
// the host and the Secret; the host's session with the router stays up.
// Once the Secret exists, the host tries the session (the state is BGP's
// own, no longer an error).
func TestBGPPeerStatusSaysWhyASessionCannotOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lb := cluster.Nodes[0]
	startLB(t, ctx, lb)
	api := e2eutil.APIClient(t, cluster)
	peer := &lbv1alpha1.BGPPeer{
		ObjectMeta: metav1.ObjectMeta{Name: "nowhere"},
		Spec: lbv1alpha1.BGPPeerSpec{
			// An address on the node network that nothing answers.
			PeerAddress: strings.TrimSuffix(lb.IP, lb.IP[strings.LastIndex(lb.IP, ".")+1:]) + "250",
			PeerASN:     64501, MyASN: 64512,
			PasswordSecretRef: &lbv1alpha1.SecretReference{Name: "nowhere-password"},
			NodeSelector:      &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: lb.Name}},
		},
	}
	if err := api.Create(ctx, peer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), peer) })

	wantMessage := fmt.Sprintf("%s: error (BGPPeer nowhere: reading the password Secret ebb-system/nowhere-password", lb.Name)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the BGPPeer's status naming the missing Secret", func(ctx context.Context) (bool, string) {
		var got lbv1alpha1.BGPPeer
		if err := api.Get(ctx, ctrlclient.ObjectKeyFromObject(peer), &got); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(got.Status.Conditions, lbv1alpha1.EstablishedCondition)
		ok := got.Status.Selected == 1 && got.Status.Established == 0 && c != nil && c.Status == metav1.ConditionFalse &&
			c.Reason == lbv1alpha1.ReasonSessionsDown && strings.Contains(c.Message, wantMessage)
		return ok, fmt.Sprintf("%+v", got.Status)
	})
	waitPeerStatus(t, ctx, "router", "1", "1")

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "nowhere-password", Namespace: "ebb-system",
		Labels: map[string]string{lbv1alpha1.PasswordSecretLabel: "true"}}, StringData: map[string]string{"password": "x"}}
	if _, err := cluster.Client.CoreV1().Secrets(secret.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Secrets(secret.Namespace).Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	e2eutil.Eventually(t, ctx, 30*time.Second, "the host trying the session once the Secret exists", func(ctx context.Context) (bool, string) {
		var got lbv1alpha1.BGPPeer
		if err := api.Get(ctx, ctrlclient.ObjectKeyFromObject(peer), &got); err != nil {
			return false, err.Error()
		}
		ok := len(got.Status.Sessions) == 1 && got.Status.Sessions[0].State != lbv1alpha1.SessionError &&
			got.Status.Sessions[0].State != lbv1alpha1.SessionConfiguring && got.Status.Sessions[0].State != "established"
		return ok, fmt.Sprintf("%+v", got.Status)
	})
}

// The API refuses a BGPPeer it cannot use, saying how to fix it.
func TestBGPPeerValidation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := e2eutil.APIClient(t, cluster)
	tests := []struct {
		name string
		spec lbv1alpha1.BGPPeerSpec
		want string
	}{
		{"not an address", lbv1alpha1.BGPPeerSpec{PeerAddress: "router.example", PeerASN: 64500, MyASN: 64512}, "peerAddress must be an IP address"},
		{"hold time too short", lbv1alpha1.BGPPeerSpec{PeerAddress: "10.0.0.1", PeerASN: 64500, MyASN: 64512, HoldTime: &metav1.Duration{Duration: time.Second}}, "holdTime must be 0s or between 3s and 65535s"},
		{"keepalive not shorter", lbv1alpha1.BGPPeerSpec{PeerAddress: "10.0.0.1", PeerASN: 64500, MyASN: 64512, HoldTime: &metav1.Duration{Duration: 9 * time.Second}, KeepaliveTime: &metav1.Duration{Duration: 9 * time.Second}}, "keepaliveTime must be shorter than holdTime"},
		{"no AS number", lbv1alpha1.BGPPeerSpec{PeerAddress: "10.0.0.1", PeerASN: 64500}, "spec.myASN"},
	}
	for _, tt := range tests {
		p := &lbv1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "invalid"}, Spec: tt.spec}
		err := api.Create(ctx, p)
		if err == nil {
			_ = api.Delete(ctx, p)
			t.Errorf("%s: created", tt.name)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q in it", tt.name, err, tt.want)
		}
	}
}
