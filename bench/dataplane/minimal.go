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
	return startSelf(t, dir, "minimal-go", frontend, "-serve-minimal-proxy", frontend, "-backends", strings.Join(backends, ","))
}

// startSelf runs this binary with args on core 0 of the load balancer's
// host (GOMAXPROCS=1), as the contender name, and returns once frontend
// answers; its output goes to name.log in dir, quoted if it never does.
func startSelf(t *topology, dir, name, frontend string, args ...string) (*lbProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("taskset", append([]string{"-c", "0", self}, args...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	logPath := filepath.Join(dir, name+".log")
	log, _ := os.Create(logPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := t.startLB(cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &lbProcess{name: name, cmd: cmd, frontend: frontend, dir: dir}
	if err := waitListening(t, frontend); err != nil {
		p.stop()
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s: %w: %s", name, err, out)
	}
	return p, nil
}
