package dataplane

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, c Config)
	}{{
		name: "defaults are filled in",
		yaml: `
frontends:
- name: web
  address: 10.96.255.1
  port: 80
  healthCheck: {protocol: HTTP, port: 10256, path: /healthz}
  backends:
  - {address: 10.0.0.1, port: 30080, owner: node-1}
`,
		check: func(t *testing.T, c Config) {
			f := c.Frontends[0]
			if f.Protocol != TCP || f.Balancing != RoundRobin || f.ConnectTimeout.Duration != DefaultConnectTimeout || f.IdleTimeout.Duration != DefaultTCPIdleTimeout {
				t.Errorf("frontend defaults: %+v", f)
			}
			hc := f.HealthCheck
			if hc.Interval.Duration != 5*time.Second || hc.UnhealthyThreshold != 2 || hc.HealthyThreshold != 1 || hc.Timeout.Duration != 5*time.Second {
				t.Errorf("health check defaults: %+v", hc)
			}
			if b := f.Backends[0]; b.Weight != 1 || b.AdminState != AdminNone {
				t.Errorf("backend defaults: %+v", b)
			}
		},
	}, {
		name: "durations as strings and numbers, IPv6",
		yaml: `
frontends:
- {name: dns, address: "fd00::1", port: 53, protocol: UDP, idleTimeout: 10s, connectTimeout: 1.5,
   backends: [{address: "fd00::10", port: 53, adminState: Down}]}
`,
		check: func(t *testing.T, c Config) {
			f := c.Frontends[0]
			if f.IdleTimeout.Duration != 10*time.Second || f.ConnectTimeout.Duration != 1500*time.Millisecond || f.Backends[0].AdminState != AdminDown {
				t.Errorf("got %+v", f)
			}
		},
	}, {
		name:    "unknown field",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, backend: []}]",
		wantErr: `unknown field "backend"`,
	}, {
		name:    "bad address",
		yaml:    "frontends: [{name: a, address: example.com, port: 80}]",
		wantErr: `frontends[0] (a): address "example.com" is not an IP address`,
	}, {
		name:    "missing port",
		yaml:    "frontends: [{name: a, address: 10.0.0.1}]",
		wantErr: "port is required",
	}, {
		name:    "bad protocol",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, protocol: SCTP}]",
		wantErr: `protocol "SCTP" is not supported: use TCP or UDP`,
	}, {
		name:    "bad admin state",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, backends: [{address: 10.0.0.2, port: 1, adminState: Draining}]}]",
		wantErr: `backends[0]: adminState "Draining" is not supported: use None, Down or Up`,
	}, {
		name:    "duplicate listener",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80}, {name: b, address: 10.0.0.1, port: 80}]",
		wantErr: `TCP/10.0.0.1:80 is also served by frontend "a"`,
	}, {
		name:  "same port, other protocol is fine",
		yaml:  "frontends: [{name: a, address: 10.0.0.1, port: 53}, {name: b, address: 10.0.0.1, port: 53, protocol: UDP}]",
		check: func(*testing.T, Config) {},
	}, {
		name:    "duplicate backend",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, backends: [{address: 10.0.0.2, port: 1}, {address: 10.0.0.2, port: 1}]}]",
		wantErr: "10.0.0.2:1 is listed twice",
	}, {
		name:    "bad source range",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, sourceRanges: [10.0.0.0]}]",
		wantErr: `sourceRanges: "10.0.0.0" is not a CIDR prefix`,
	}, {
		name:    "proxy protocol on UDP",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, protocol: UDP, proxyProtocol: true}]",
		wantErr: "proxyProtocol is supported for TCP frontends only",
	}, {
		name:    "bad duration",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, idleTimeout: soon}]",
		wantErr: `invalid duration "soon"`,
	}, {
		name:    "weight out of range",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, backends: [{address: 10.0.0.2, port: 1, weight: 1000}]}]",
		wantErr: "weight 1000 is out of range: use 1 to 256",
	}, {
		name:    "probe interval too short",
		yaml:    "frontends: [{name: a, address: 10.0.0.1, port: 80, healthCheck: {protocol: TCP, interval: 1ms}}]",
		wantErr: "interval 1ms is too short",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

// FuzzParseConfig: no input panics, and a configuration that parses is
// stable: written out and read back it is the same.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("frontends: [{name: a, address: 10.0.0.1, port: 80, backends: [{address: 10.0.0.2, port: 1}]}]"))
	f.Add([]byte("frontends: [{name: d, address: 'fd00::1', port: 53, protocol: UDP, healthCheck: {protocol: HTTP, path: /x}}]"))
	f.Add([]byte(`{"frontends":[{"name":"a","address":"10.0.0.1","port":80,"idleTimeout":"1s","sourceRanges":["10.0.0.0/8"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("marshalling a valid configuration: %v", err)
		}
		again, err := ParseConfig(out)
		if err != nil {
			t.Fatalf("a valid configuration does not parse back: %v\n%s", err, out)
		}
		out2, _ := json.Marshal(again)
		if string(out) != string(out2) {
			t.Fatalf("not stable:\n%s\n%s", out, out2)
		}
	})
}
