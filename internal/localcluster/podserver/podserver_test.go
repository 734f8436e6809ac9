package podserver

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/pires/go-proxyproto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// freePort returns a TCP port that was free on loopback a moment ago.
func freePort(t *testing.T) int32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

func startTestPod(t *testing.T) (*podServer, string) {
	t.Helper()
	port := freePort(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1"},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{
			Ports: []corev1.ContainerPort{{ContainerPort: port, Protocol: corev1.ProtocolTCP}},
		}}},
		Status: corev1.PodStatus{PodIP: "127.0.0.1", Phase: corev1.PodRunning},
	}
	p, err := startPod(pod, localSockets{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.closeAll)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

func TestHTTPEchoNamesThePod(t *testing.T) {
	_, addr := startTestPod(t)
	resp, err := http.Get("http://" + addr + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var id Identity
	if err := json.NewDecoder(resp.Body).Decode(&id); err != nil {
		t.Fatal(err)
	}
	if id.Pod != "web-1" || id.Namespace != "ns" || id.Node != "node-1" || id.Path != "/hello" || resp.Header.Get("X-Pod-Name") != "web-1" {
		t.Errorf("identity %+v, header %q", id, resp.Header.Get("X-Pod-Name"))
	}
}

// A connection that starts with a PROXY protocol v2 header (ebb's proxy
// engine, lb.ebb.dev/proxy-protocol: v2) is answered with the client the
// header names; one without a header, with its peer.
func TestHTTPEchoReadsAProxyProtocolHeader(t *testing.T) {
	_, addr := startTestPod(t)
	client := &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 40123}
	for _, tt := range []struct {
		name   string
		header bool
		want   string
	}{{"with a header", true, client.String()}, {"without", false, "127.0.0.1:"}} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if tt.header {
			dst, _ := net.ResolveTCPAddr("tcp", addr)
			if _, err := proxyproto.HeaderProxyFromAddrs(2, client, dst).WriteTo(conn); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		var id Identity
		if err := json.NewDecoder(resp.Body).Decode(&id); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if !strings.HasPrefix(id.Client, tt.want) {
			t.Errorf("%s: client %q, want %q", tt.name, id.Client, tt.want)
		}
	}
}

func TestTCPEcho(t *testing.T) {
	tests := []struct {
		name string
		send string
	}{
		{"binary", "\x00\x01\x02hello"},
		{"a prefix of an HTTP method", "GE"},
		{"looks like a method without the space", "GETTER"},
		{"empty", ""},
	}
	_, addr := startTestPod(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte(tt.send)); err != nil {
				t.Fatal(err)
			}
			// Half-close: the echo must still answer, then close its side.
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.send {
				t.Errorf("echo %q, want %q", got, tt.send)
			}
		})
	}
}

func TestTerminateRefusesNewConnectionsAndKeepsEstablishedOnesUntilDeadline(t *testing.T) {
	p, addr := startTestPod(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip := func() error {
		if _, err := conn.Write([]byte("ping")); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 4)
		_, err := io.ReadFull(conn, buf)
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakeClock(time.Now())
	p.terminate(clk, clk.Now(), clk.Now().Add(30*time.Second))
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("a terminating pod accepted a new connection")
	}
	clk.Step(29 * time.Second)
	if err := roundTrip(); err != nil {
		t.Fatalf("established connection broke before the deadline: %v", err)
	}
	clk.Step(time.Second)
	// The deadline's timer runs on its own goroutine: allow it a moment.
	for start := time.Now(); roundTrip() == nil; {
		if time.Since(start) > 2*time.Second {
			t.Fatal("established connection still works after the deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With a preStop sleep the pod keeps accepting new connections until the
// sleep ends, then refuses them.
func TestPreStopSleepKeepsAcceptingUntilItEnds(t *testing.T) {
	p, addr := startTestPod(t)
	clk := testingclock.NewFakeClock(time.Now())
	p.terminate(clk, clk.Now().Add(3*time.Second), clk.Now().Add(30*time.Second))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("refused during the preStop sleep: %v", err)
	}
	c.Close()
	clk.Step(3 * time.Second)
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Since(start) > 2*time.Second {
			t.Fatal("still accepting after the preStop sleep")
		}
	}
}

// kwok gives a new pod the IP of a pod deleted a moment ago, whose servers
// are still in their grace period (its UDP socket too): the new pod takes
// the address over and serves at once, as it would once a kubelet had torn
// down the old sandbox.
func TestNewPodTakesOverAReusedIPFromATerminatingPod(t *testing.T) {
	tcpPort := freePort(t)
	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	udpPort := int32(probe.LocalAddr().(*net.UDPAddr).Port)
	_ = probe.Close()
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
				{ContainerPort: tcpPort, Protocol: corev1.ProtocolTCP},
				{ContainerPort: udpPort, Protocol: corev1.ProtocolUDP},
			}}}},
			Status: corev1.PodStatus{PodIP: "127.0.0.1", Phase: corev1.PodRunning},
		}
	}
	s := New(nil, nil)
	clk := testingclock.NewFakeClock(time.Now())
	s.clock = clk
	t.Cleanup(func() {
		for _, p := range s.byIP {
			p.closeAll()
		}
	})
	log := logr.Discard()

	old := pod("web-old")
	s.sync(log, old)
	deleting := old.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: clk.Now()}
	deleting.DeletionGracePeriodSeconds = ptr.To[int64](30)
	s.sync(log, deleting)
	s.deleted(deleting)

	s.sync(log, pod("web-new"))
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", tcpPort))
	if err != nil {
		t.Fatalf("the new pod does not serve its reused IP: %v", err)
	}
	defer resp.Body.Close()
	var id Identity
	if err := json.NewDecoder(resp.Body).Decode(&id); err != nil {
		t.Fatal(err)
	}
	if id.Pod != "web-new" {
		t.Errorf("answered by %q, want web-new", id.Pod)
	}
}

// A pod is served from the moment it has an IP, while Pending too (its
// containers are starting: kwok reports Running and Ready in one step, and
// an endpoint must not be routed to before anything listens), until it
// ends.
func TestServesFromPendingUntilEnded(t *testing.T) {
	for _, tc := range []struct {
		phase corev1.PodPhase
		serve bool
	}{
		{corev1.PodPending, true},
		{corev1.PodRunning, true},
		{corev1.PodSucceeded, false},
		{corev1.PodFailed, false},
	} {
		t.Run(string(tc.phase), func(t *testing.T) {
			port := freePort(t)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "web"},
				Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{ContainerPort: port, Protocol: corev1.ProtocolTCP}}}}},
				Status:     corev1.PodStatus{PodIP: "127.0.0.1", Phase: tc.phase},
			}
			s := New(nil, nil)
			t.Cleanup(func() {
				for _, p := range s.byIP {
					p.closeAll()
				}
			})
			s.sync(logr.Discard(), pod)
			conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				conn.Close()
			}
			if served := err == nil; served != tc.serve {
				t.Errorf("a %s pod served: %v, want %v (dial: %v)", tc.phase, served, tc.serve, err)
			}
		})
	}
}
