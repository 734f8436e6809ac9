package controller

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// With --cloud azure the spot taint is the design's
// cloudprovider.azure.microsoft.com/draining, unless the flag was given.
func TestCloudDefaults(t *testing.T) {
	for _, tt := range []struct {
		name, cloud, flag string
		changed           bool
		want              string
	}{
		{"no cloud: ebb's own key", "", lbmodel.TaintDraining, false, lbmodel.TaintDraining},
		{"azure: the design's key", "azure", lbmodel.TaintDraining, false, lbmodel.TaintAzureDraining},
		{"azure, key given", "azure", "example.com/spot", true, "example.com/spot"},
		{"azure, turned off", "azure", "", true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &Options{Cloud: tt.cloud, SpotTaintKey: tt.flag}
			o.cloudDefaults(func(string) bool { return tt.changed })
			if o.SpotTaintKey != tt.want {
				t.Errorf("spot taint key %q, want %q", o.SpotTaintKey, tt.want)
			}
		})
	}
}

// The webhook server does not speak HTTP/2 (issue 42 item 4): a client
// that offers only h2 gets HTTP/1.1.
func TestWebhookServerRefusesHTTP2(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	// httptest sets its own NextProtos at start: apply ebb's option to a
	// server config the way controller-runtime's webhook server does.
	cfg := srv.TLS.Clone()
	onlyHTTP1(cfg)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() { _ = http.Serve(ln, srv.Config.Handler) }()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}) //nolint:gosec // a test server's own certificate
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Errorf("negotiated %q, want HTTP/1.1 only", p)
	}
}

// The metrics are unauthenticated: by default only this host reaches them
// (before: every address, ":8080").
func TestMetricsListenOnTheLoopbackByDefault(t *testing.T) {
	def := NewCommand().Flags().Lookup("metrics-bind-address").DefValue
	if ap, err := netip.ParseAddrPort(def); err != nil || !ap.Addr().IsLoopback() {
		t.Errorf("--metrics-bind-address defaults to %q, want a loopback address", def)
	}
}

// A spot taint that the leaving signals do not count is refused at start:
// preempted nodes would be tainted and stay in rotation (issue 49).
func TestSpotTaintMustBeALeavingSignal(t *testing.T) {
	list := func(lines string) []lbmodel.LeavingSignal {
		s, err := lbmodel.ParseLeavingSignals(lines)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tt := range []struct {
		name    string
		key     string
		signals []lbmodel.LeavingSignal
		ok      bool
	}{
		{"off", "", nil, true},
		{"ebb's key always counts", lbmodel.TaintDraining, list("label:example.com/gone"), true},
		{"Azure's key, default list", lbmodel.TaintAzureDraining, nil, true},
		{"Azure's key left out of the list", lbmodel.TaintAzureDraining, list("taint:karpenter.sh/disrupted"), false},
		{"own key, default list", "example.com/spot", nil, false},
		{"own key with its value in the list", "example.com/spot", list("taint:example.com/spot=spot-eviction"), true},
		{"own key, any value in the list", "example.com/spot", list("taint:example.com/spot"), true},
		{"own key, another value in the list", "example.com/spot", list("taint:example.com/spot=other"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := spotTaintCounts(tt.key, lbmodel.Options{LeavingSignals: tt.signals})
			if (err == nil) != tt.ok {
				t.Errorf("spotTaintCounts(%q) = %v, want ok %v", tt.key, err, tt.ok)
			}
		})
	}
}
