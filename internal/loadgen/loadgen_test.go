package loadgen

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// echoHandler answers /echo?msg=M with M, as agnhost netexec does.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, r.URL.Query().Get("msg"))
}

func TestLongLivedHTTPKeepsOneConnection(t *testing.T) {
	conns := make(chan struct{}, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(echoHandler))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	l, err := OpenLongLivedHTTPVia(nil, srv.Listener.Addr().String(), 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Echoes() < 10 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	l.Close()
	if l.Echoes() < 10 {
		t.Fatalf("%d round trips in 5 s, want 10 (broken: %q)", l.Echoes(), l.Broken())
	}
	if why := l.Broken(); why != "" {
		t.Errorf("the connection broke: %s", why)
	}
	if n := len(conns); n != 1 {
		t.Errorf("the server saw %d connections, want 1 kept alive", n)
	}
}

func TestLongLivedRoundTripsNoticeWhatBreaks(t *testing.T) {
	tests := []struct {
		name   string
		trip   roundTrip
		answer string
		want   string
	}{
		{"raw echo", echoBytes, "long-lived 0\n", ""},
		{"raw echo, wrong bytes", echoBytes, "long-lived 9\n", "echo"},
		{"http echo", echoHTTP("x"), "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nlong-lived-0", ""},
		{"http echo, wrong body", echoHTTP("x"), "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnop", "want 200"},
		{"http echo, an error", echoHTTP("x"), "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nlong-lived-0", "want 200"},
		{"http echo, the server closes", echoHTTP("x"), "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 12\r\n\r\nlong-lived-0", "closed"},
		{"http echo, no answer", echoHTTP("x"), "", "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			go func() {
				defer server.Close()
				_, _ = bufio.NewReader(server).ReadString('\n') // the request's first line
				_, _ = io.WriteString(server, tt.answer)
			}()
			_ = client.SetDeadline(time.Now().Add(2 * time.Second))
			err := tt.trip(client, bufio.NewReader(client), 0)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("round trip: %v, want success", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("round trip: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestRequestsNameWhatServedThemWithServing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "web-1") }))
	defer srv.Close()
	r := &Requests{URL: srv.URL + "/hostname", Rate: 200, Serving: func(b []byte) string { return fmt.Sprintf("pod %s", b) }}
	r.Start()
	time.Sleep(100 * time.Millisecond)
	r.Stop()
	samples := r.Samples()
	if len(samples) == 0 {
		t.Fatal("no request was sent")
	}
	for _, s := range samples {
		if s.Failed || s.Node != "pod web-1" {
			t.Fatalf("sample %+v, want served by %q", s, "pod web-1")
		}
	}
}
