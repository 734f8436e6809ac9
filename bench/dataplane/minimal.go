package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// serveMinimalProxy is the calibration floor for a proxy written in Go: an
// accept loop, round robin over the backends, net.Dial with Go's defaults
// and io.Copy both ways (which splices between two TCP connections), the
// half-close passed on. No admin state, probes, metrics, timeouts or
// connection tracking: what any Go proxy pays at least.
func serveMinimalProxy(listen string, backends []string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var next atomic.Uint64
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", backends[next.Add(1)%uint64(len(backends))])
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				_ = up.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(c, up)
			_ = c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

// startMinimalGo runs this binary as the minimal Go proxy on core 0 with
// GOMAXPROCS=1, like ebb.
func startMinimalGo(t *topology, dir, frontend string, backends []string) (*lbProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("taskset", "-c", "0", self, "-serve-minimal-proxy", frontend, "-backends", strings.Join(backends, ","))
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	log, _ := os.Create(filepath.Join(dir, "minimal-go.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := t.startLB(cmd); err != nil {
		return nil, fmt.Errorf("starting the minimal Go proxy: %w", err)
	}
	p := &lbProcess{name: "minimal-go", cmd: cmd, frontend: frontend, dir: dir}
	if err := waitListening(t, frontend); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}
