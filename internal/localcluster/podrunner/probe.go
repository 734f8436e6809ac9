package podrunner

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// dialer opens connections from where the pod's network is.
type dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// prober runs one container's probe as a kubelet does: every period, with
// a timeout, and a result once success or failure thresholds are reached.
type prober struct {
	probe *corev1.Probe
	pod   *corev1.Pod
	c     *corev1.Container
	net   dialer
}

// timing is the probe's schedule with the kubelet's defaults.
func (p *prober) timing() (initial, period, timeout time.Duration, success, failure int) {
	pr := p.probe
	initial = time.Duration(pr.InitialDelaySeconds) * time.Second
	period, timeout = 10*time.Second, time.Second
	success, failure = 1, 3
	if pr.PeriodSeconds > 0 {
		period = time.Duration(pr.PeriodSeconds) * time.Second
	}
	if pr.TimeoutSeconds > 0 {
		timeout = time.Duration(pr.TimeoutSeconds) * time.Second
	}
	if pr.SuccessThreshold > 0 {
		success = int(pr.SuccessThreshold)
	}
	if pr.FailureThreshold > 0 {
		failure = int(pr.FailureThreshold)
	}
	return initial, period, timeout, success, failure
}

// run probes until ctx is done, calling result on every change of outcome
// (after the thresholds) from state, the outcome assumed before the first
// probe: not ready for a readiness probe, alive for a liveness probe.
func (p *prober) run(ctx context.Context, state bool, result func(ok bool, msg string)) {
	initial, period, timeout, successes, failures := p.timing()
	if !sleep(ctx, initial) {
		return
	}
	okRun, failRun := 0, 0
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := p.once(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
		} else {
			okRun, failRun = 0, failRun+1
		}
		switch {
		case okRun >= successes && !state:
			state = true
			result(true, "")
		case failRun >= failures && state:
			state = false
			result(false, err.Error())
		}
		if !sleep(ctx, period) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// once runs the probe one time.
func (p *prober) once(ctx context.Context) error {
	h := p.probe.ProbeHandler
	switch {
	case h.HTTPGet != nil:
		return p.httpGet(ctx, h.HTTPGet)
	case h.TCPSocket != nil:
		addr, err := p.address(h.TCPSocket.Host, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := p.net.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	default:
		return fmt.Errorf("only httpGet and tcpSocket probes are run by the local cluster")
	}
}

func (p *prober) httpGet(ctx context.Context, g *corev1.HTTPGetAction) error {
	addr, err := p.address(g.Host, g.Port)
	if err != nil {
		return err
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+g.Path, nil)
	if err != nil {
		return err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:       p.net.DialContext,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a kubelet does not verify probe certificates either
		DisableKeepAlives: true,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// address is host:port of a probe: the pod IP by default, a named port
// looked up among the container's ports.
func (p *prober) address(host string, port intstr.IntOrString) (string, error) {
	if host == "" {
		host = p.pod.Status.PodIP
	}
	n := port.IntValue()
	if port.Type == intstr.String {
		n = 0
		for _, cp := range p.c.Ports {
			if cp.Name == port.StrVal {
				n = int(cp.ContainerPort)
			}
		}
		if n == 0 {
			return "", fmt.Errorf("container %s has no port named %q", p.c.Name, port.StrVal)
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}
