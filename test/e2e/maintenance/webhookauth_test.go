package maintenance_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// ebb's webhooks answer only the API server (issue 42 item 4): a pod that
// reaches the controller's port 9443 and sends an AdmissionReview, which
// would cost a SubjectAccessReview per node it names, is refused; the API
// server, with its client certificate, is answered (as every other test of
// this suite shows, each NodeMaintenance going through admission).
func TestWebhookAnswersOnlyTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	pinnedApp(t, ctx, ns, "caller", cluster.Nodes[0].Name, "", 1)
	caller := appPods(t, ctx, ns, "caller")[0]
	pod, closePod, err := cluster.PodHost(&caller)
	if err != nil {
		t.Fatal(err)
	}
	defer closePod()
	// A ready replica that is not going away (earlier tests roll the
	// controller out).
	var controllerIP string
	eventually(t, ctx, time.Minute, "a ready controller replica", func(ctx context.Context) (bool, string) {
		controllers, err := cluster.Client.CoreV1().Pods("ebb-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ebb-controller"})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range controllers.Items {
			if p.DeletionTimestamp == nil && p.Status.PodIP != "" && podutils.IsPodReady(&p) {
				controllerIP = p.Status.PodIP
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods, none ready", len(controllers.Items))
	})
	url := "https://" + net.JoinHostPort(controllerIP, "9443") + "/validate-maintenance-ebb-dev-v1alpha1-nodemaintenance"

	// A review of a maintenance of every node: without the check, one
	// SubjectAccessReview per node.
	nm := maintenance("forged", v1alpha1.Drain, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpExists}},
	}}})
	nm.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeMaintenance"}
	raw, err := json.Marshal(nm)
	if err != nil {
		t.Fatal(err)
	}
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("e2e-forged"), Operation: admissionv1.Create, Name: nm.Name,
			Kind:     metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: "NodeMaintenance"},
			Resource: metav1.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "nodemaintenances"},
			Object:   runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func(certs []tls.Certificate) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DialContext: pod.DialContext,
			// The test checks who the server answers, not who it is.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}, //nolint:gosec // see above
		}}
		resp, err := c.Post(url, "application/json", bytes.NewReader(review))
		if err != nil {
			t.Fatalf("posting an AdmissionReview from pod %s: %v", caller.Name, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	if code, body := post(nil); code != http.StatusForbidden || !strings.Contains(body, "client certificate") {
		t.Errorf("a pod without a client certificate: %d %q, want 403 saying a client certificate is required", code, body)
	}
	apiserver, err := tls.LoadX509KeyPair(cluster.WebhookClientCertFile, cluster.WebhookClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	code, body := post([]tls.Certificate{apiserver})
	var answer admissionv1.AdmissionReview
	if code != http.StatusOK || json.Unmarshal([]byte(body), &answer) != nil || answer.Response == nil || answer.Response.UID != "e2e-forged" {
		t.Errorf("the API server's certificate: %d %q, want an AdmissionReview's answer", code, body)
	}
}
