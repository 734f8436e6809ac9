package azurefake

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
)

// TokenPath is where the server answers managed-identity token requests
// (App Service style: IDENTITY_ENDPOINT and IDENTITY_HEADER).
const TokenPath = "/msi/token"

// Serve serves the cloud over HTTPS, as Azure Resource Manager would, plus
// a managed-identity token endpoint, so that a separate process (ebb
// controller) can use it: point resourceManagerEndpoint at URL, set
// IDENTITY_ENDPOINT=URL+TokenPath and IDENTITY_HEADER to anything, and
// trust the returned CA (SSL_CERT_FILE).
func (c *Cloud) Serve() (srv *httptest.Server, caPEM []byte) {
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
	srv = httptest.NewTLSServer(mux)
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv, caPEM
}
