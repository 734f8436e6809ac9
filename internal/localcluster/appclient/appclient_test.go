package appclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAnsweringPod(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("app-7d9f-x2x\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"pod":"echo-1","node":"node-2"}`))
	})
	mux.HandleFunc("/broken", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no backend", http.StatusServiceUnavailable)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	empty := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer empty.Close()

	tests := []struct {
		name    string
		real    bool
		target  string
		want    string
		wantErr string
	}{
		{name: "agnhost names its pod", real: true, target: srv.URL + "/echo?msg=x", want: "app-7d9f-x2x"},
		{name: "the echo server names its pod", target: srv.URL + "/", want: "echo-1"},
		{name: "a status other than 200 quotes the body", target: srv.URL + "/broken", wantErr: "503 Service Unavailable: no backend"},
		{name: "an empty name is an error", real: true, target: empty.URL, wantErr: "no pod name"},
		{name: "an answer that is not an identity", target: empty.URL, wantErr: "not an echo server's identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AnsweringPod(context.Background(), srv.Client(), tt.real, tt.target)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("AnsweringPod = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
