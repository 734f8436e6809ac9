package securemetrics

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
)

// fakeAPIServer answers TokenReviews (the token "reader" and "stranger"
// are users reader and stranger, anything else is not authenticated) and
// SubjectAccessReviews (only reader may get /metrics).
func fakeAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		var review authnv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch review.Spec.Token {
		case "reader", "stranger":
			review.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: review.Spec.Token}}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
	mux.HandleFunc("/apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		var review authzv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		nr := review.Spec.NonResourceAttributes
		review.Status.Allowed = review.Spec.User == "reader" && nr != nil && nr.Path == "/metrics" && nr.Verb == "get"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

// Only a caller whose token the API server authenticates and authorizes
// for GET /metrics reads the metrics, over TLS.
func TestServerAnswersOnlyAuthorizedCallers(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ebb_test_total", Help: "A counter."})
	reg.MustRegister(c)
	c.Inc()
	handler, err := Handler(logr.Discard(), fakeAPIServer(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Server{Address: address, Handler: handler, TLS: tlsConfig}.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, path, token string) (int, string) {
		t.Helper()
		var resp *http.Response
		var err error
		for range 50 { // until the server listens
			req, _ := http.NewRequest(http.MethodGet, scheme+"://"+address+path, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			if resp, err = client.Do(req); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct {
		name, scheme, path, token string
		want                      int
	}{
		{"authorized", "https", "/metrics", "reader", http.StatusOK},
		{"no token", "https", "/metrics", "", http.StatusUnauthorized},
		// controller-runtime's filter answers 500 for a token the API
		// server refuses: the bearer-token authenticator reports it as an
		// error, not as "no user".
		{"a token the API server refuses", "https", "/metrics", "forged", http.StatusInternalServerError},
		{"authenticated, not authorized", "https", "/metrics", "stranger", http.StatusForbidden},
		// The review is for the path asked: reader may get /metrics only.
		{"another path", "https", "/debug/pprof/", "reader", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(tc.scheme, tc.path, tc.token)
			if code != tc.want {
				t.Errorf("GET %s with token %q: %d, want %d: %s", tc.path, tc.token, code, tc.want, body)
			}
			if code == http.StatusOK && !strings.Contains(body, "ebb_test_total 1") {
				t.Errorf("the metrics lack the counter:\n%s", body)
			}
		})
	}
	if code, body := get("http", "/metrics", "reader"); code == http.StatusOK {
		t.Errorf("plain HTTP answered: %s", body)
	}
}

// What a caller without a valid token may cost is bounded before any API
// call: an oversized header is refused, and requests beyond the rate get
// 429.
func TestBoundedRefusesBeforeTheAPIServer(t *testing.T) {
	reached := 0
	h := bounded(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ }), rate.NewLimiter(1, 2))
	do := func(auth string) int {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Header.Set("Authorization", auth)
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := do("Bearer " + strings.Repeat("x", maxAuthorization)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("an oversized token: %d", code)
	}
	codes := []int{do("Bearer a"), do("Bearer b"), do("Bearer c")}
	if codes[0] != http.StatusOK || codes[1] != http.StatusOK || codes[2] != http.StatusTooManyRequests {
		t.Errorf("three requests at once with a burst of 2: %v, want 200 200 429", codes)
	}
	if reached != 2 {
		t.Errorf("%d requests reached the authentication, want 2", reached)
	}
}

func TestNormalizeAddress(t *testing.T) {
	for in, want := range map[string]string{
		":9474":             ":9474",
		"10.0.0.1:9474":     "10.0.0.1:9474",
		"fd00::1:9474":      "[fd00::1]:9474",
		"[fd00::1]:9474":    "[fd00::1]:9474",
		"localhost:9474":    "localhost:9474",
		"2001:db8::12:9475": "[2001:db8::12]:9475",
	} {
		if got := NormalizeAddress(in); got != want {
			t.Errorf("NormalizeAddress(%q) = %q, want %q", in, got, want)
		}
	}
}
