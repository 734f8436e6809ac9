package azurefake

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	certutil "k8s.io/client-go/util/cert"
)

// TokenPath is where the server answers managed-identity token requests
// (App Service style: IDENTITY_ENDPOINT and IDENTITY_HEADER).
const TokenPath = "/msi/token"

// Serve serves the cloud over HTTPS on ip (a free port), as Azure Resource
// Manager would, plus a managed-identity token endpoint, so that a separate
// process (ebb controller, in a pod) can use it: point
// resourceManagerEndpoint at URL, set IDENTITY_ENDPOINT=URL+TokenPath and
// IDENTITY_HEADER to anything, and trust the returned CA (SSL_CERT_FILE).
// The server's self-signed certificate names ip.
func (c *Cloud) Serve(ip netip.Addr) (srv *httptest.Server, caPEM []byte, err error) {
	transport := c.transport()
	mux := http.NewServeMux()
	mux.HandleFunc(TokenPath, func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{
			"access_token": "fake", "token_type": "Bearer", "resource": "https://management.azure.com/",
			"expires_on": strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10),
		})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// The fake dispatches on the SDK method that made the request,
		// which a request off the wire does not carry: infer it.
		api := "LoadBalancerBackendAddressPoolsClient.Get"
		switch {
		case r.Method == http.MethodPut:
			api = "LoadBalancerBackendAddressPoolsClient.BeginCreateOrUpdate"
		case r.Method == http.MethodDelete:
			api = "LoadBalancerBackendAddressPoolsClient.BeginDelete"
		case strings.Contains(r.URL.Path, "/Microsoft.Compute/virtualMachines/"):
			api = "VirtualMachinesClient.Get"
		case strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/backendAddressPools"):
			api = "LoadBalancerBackendAddressPoolsClient.NewListPager"
		}
		out := r.Clone(context.WithValue(r.Context(), runtime.CtxAPINameKey{}, api))
		out.RequestURI = ""
		out.URL.Scheme, out.URL.Host = "https", r.Host
		resp, err := transport.Do(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s for the fake Azure: %w", ip, err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(ip.String(), []net.IP{ip.AsSlice()}, nil)
	if err != nil {
		_ = ln.Close()
		return nil, nil, fmt.Errorf("making the fake Azure's certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}
	srv.StartTLS()
	// certPEM holds the serving certificate and the CA that signed it:
	// trusting both is trusting the server.
	return srv, certPEM, nil
}
