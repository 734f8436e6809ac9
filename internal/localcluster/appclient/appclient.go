// Package appclient is what a client of the local cluster's test app asks
// of it: an answer, and the name of the pod that gave it. The app is
// agnhost netexec where real kubelets run it (GET /hostname answers the
// pod's name) and ebb's echo server (podserver, which names itself in
// JSON) on simulated nodes. The e2e tests and the cluster benchmarks share
// it, so that both tell pods apart the same way.
package appclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// maxBody bounds what GetBody reads: the app's answers are a few hundred
// bytes, and a test must not buffer whatever a broken path sends.
const maxBody = 1 << 20

// GetBody sends GET target through client and returns the whole body of a
// 200 answer. Any other status is an error that quotes the start of the
// body.
func GetBody(ctx context.Context, client *http.Client, target string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the answer: %w", target, err)
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("GET %s: an answer of more than %d bytes, not the app's", target, maxBody)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %s: %.200s", target, resp.Status, body)
	}
	return body, nil
}

// GetIdentity sends GET target to an echo server of simulated nodes and
// decodes the identity it answers with.
func GetIdentity(ctx context.Context, client *http.Client, target string) (podserver.Identity, error) {
	var id podserver.Identity
	body, err := GetBody(ctx, client, target)
	if err != nil {
		return id, err
	}
	if err := json.Unmarshal(body, &id); err != nil {
		return id, fmt.Errorf("GET %s: not an echo server's identity: %w", target, err)
	}
	return id, nil
}

// Hostname asks agnhost netexec at target's host and port for /hostname
// and returns the pod name it answers.
func Hostname(ctx context.Context, client *http.Client, target string) (string, error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", fmt.Errorf("parsing %q: %w", target, err)
	}
	u.Path, u.RawQuery = "/hostname", ""
	body, err := GetBody(ctx, client, u.String())
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(body))
	if name == "" {
		return "", fmt.Errorf("GET %s: no pod name in the answer", u)
	}
	return name, nil
}

// AnsweringPod sends one request to the app at target and returns the name
// of the pod that answered: agnhost's /hostname where real kubelets run
// the app (real), the echo server's identity otherwise. It asks nothing of
// the API, so loops of requests during a drain can call it.
func AnsweringPod(ctx context.Context, client *http.Client, real bool, target string) (string, error) {
	if real {
		return Hostname(ctx, client, target)
	}
	id, err := GetIdentity(ctx, client, target)
	return id.Pod, err
}

// OpenLongLived opens a kept-alive connection to the app at addr through
// dial that sends a message every interval and checks its echo: agnhost
// netexec's /echo over HTTP keep-alive where real kubelets run the app
// (real), a raw TCP echo on simulated nodes.
func OpenLongLived(dial func(ctx context.Context, network, addr string) (net.Conn, error), real bool, addr string, interval time.Duration) (*loadgen.LongLived, error) {
	if real {
		return loadgen.OpenLongLivedHTTPVia(dial, addr, interval)
	}
	return loadgen.OpenLongLivedVia(dial, addr, interval)
}
