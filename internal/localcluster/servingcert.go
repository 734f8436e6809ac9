package localcluster

import (
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"

	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// kubernetesServiceIP is the ClusterIP of the `kubernetes` Service: the
// first address of ServiceCIDR, where pods find the apiserver
// (KUBERNETES_SERVICE_HOST).
const kubernetesServiceIP = "10.96.0.1"

// writeServingCert gives the apiserver a serving certificate for every name
// a client may dial: the control-plane address, loopback, and the
// `kubernetes` Service's ClusterIP and DNS names, as kubeadm's has. envtest's
// own names only the listen address, and a pod's in-cluster client, which
// dials the ClusterIP, would refuse it. envtest keeps certificates it finds
// in CertDir and trusts the CA set here; it then writes none of its own, so
// the service-account signing pair is written here too.
func writeServingCert(api *envtest.APIServer) error {
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesServiceIP)}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(controlPlaneIP, ips, dns)
	if err != nil {
		return fmt.Errorf("generating the apiserver's serving certificate: %w", err)
	}
	// The bundle is the serving certificate, then the CA that signed it.
	leaf, rest := pem.Decode(certPEM)
	ca, _ := pem.Decode(rest)
	if leaf == nil || ca == nil {
		return fmt.Errorf("generating the apiserver's serving certificate: expected a certificate and its CA")
	}
	saCert, saKey, err := certutil.GenerateSelfSignedCertKey("service-account-signer", nil, nil)
	if err != nil {
		return fmt.Errorf("generating the service-account signing key: %w", err)
	}
	files := map[string][]byte{"apiserver.crt": certPEM, "apiserver.key": keyPEM, "sa-signer.crt": saCert, "sa-signer.key": saKey}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(api.CertDir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing the apiserver's %s: %w", name, err)
		}
	}
	api.SecureServing.CA = pem.EncodeToMemory(ca)
	return nil
}
