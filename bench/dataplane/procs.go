package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ebbdev/ebb/internal/loopback"
)

// lbProcess is a load balancer under test: ebb or HAProxy, pinned to one
// core.
type lbProcess struct {
	name     string
	cmd      *exec.Cmd
	frontend string // address clients connect to
	dir      string
	pprof    string // ebb's pprof address, if profiling
	// drain sets backend i to drain (HAProxy) or admin Down (ebb) and
	// returns when the load balancer has confirmed it.
	drain func(i int) error
	// undrain restores backend i.
	undrain func(i int) error
	// cleanup, if set, runs after the process stopped.
	cleanup func()
	// tracksHost: the process turns conntrack on for every flow of the
	// load balancer's host (the kernel engine), so the direct slices of
	// the system-wide figures run untracked (untrackDirect).
	tracksHost bool
}

func (p *lbProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	if p.cleanup != nil {
		p.cleanup()
	}
}

func waitListening(t *topology, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := t.dial(addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

// ebbConfig renders `ebb lb`'s configuration; down marks backends Down.
func ebbConfig(frontend string, backends []string, down map[int]bool) string {
	host, port, _ := net.SplitHostPort(frontend)
	var b strings.Builder
	fmt.Fprintf(&b, "frontends:\n- name: bench\n  address: %s\n  port: %s\n  idleTimeout: 4m\n  backends:\n", host, port)
	for i, be := range backends {
		h, p, _ := net.SplitHostPort(be)
		state := "None"
		if down[i] {
			state = "Down"
		}
		fmt.Fprintf(&b, "  - {address: %s, port: %s, adminState: %s, owner: s%d}\n", h, p, state, i+1)
	}
	return b.String()
}

// startEbb runs `ebb lb` on core 0 with GOMAXPROCS=1 (HAProxy runs one
// thread). Drain rewrites the file, sends SIGHUP and waits until the
// metrics show the reload applied.
func startEbb(t *topology, ebbBin, dir, frontend string, backends []string, profile bool, extraArgs ...string) (*lbProcess, error) {
	file := filepath.Join(dir, "ebb.yaml")
	if err := os.WriteFile(file, []byte(ebbConfig(frontend, backends, nil)), 0o644); err != nil {
		return nil, err
	}
	metrics := t.lbLocal()
	args := append([]string{"-c", "0", ebbBin, "lb", "--config", file, "--metrics-bind-address", metrics, "--poll-interval", "1h"}, extraArgs...)
	pprofAddr := ""
	if profile {
		pprofAddr = t.lbLocal()
		args = append(args, "--pprof-bind-address", pprofAddr)
	}
	cmd := exec.Command("taskset", args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	log, _ := os.Create(filepath.Join(dir, "ebb.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := t.startLB(cmd); err != nil {
		return nil, fmt.Errorf("starting ebb lb: %w", err)
	}
	p := &lbProcess{name: "ebb", cmd: cmd, frontend: frontend, dir: dir, pprof: pprofAddr}
	reloads := func() int {
		resp, err := t.lbHTTP().Get("http://" + metrics + "/metrics")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), `ebb_lb_config_reloads_total{result="success"}`) {
				n, _ := strconv.Atoi(strings.Fields(sc.Text())[1])
				return n
			}
		}
		return -1
	}
	apply := func(down map[int]bool) error {
		before := reloads()
		if err := os.WriteFile(file, []byte(ebbConfig(frontend, backends, down)), 0o644); err != nil {
			return err
		}
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if reloads() > before {
				return nil
			}
		}
		return fmt.Errorf("ebb did not reload")
	}
	p.drain = func(i int) error { return apply(map[int]bool{i: true}) }
	p.undrain = func(int) error { return apply(nil) }
	if err := waitListening(t, frontend); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// startHAProxy runs HAProxy 2.6 (mode tcp, roundrobin, one thread, splicing
// on) on core 0; tuned adds the options that save system calls per
// connection (tcp-smart-accept and tcp-smart-connect: no empty ACK of its
// own before the first data). Drain uses the admin socket's `set server
// be/sN state drain`.
func startHAProxy(t *topology, dir, frontend string, backends []string, tuned bool) (*lbProcess, error) {
	name := "haproxy"
	extra := ""
	if tuned {
		name = "haproxy-tuned"
		extra = "  option tcp-smart-accept\n  option tcp-smart-connect\n"
	}
	sock := filepath.Join(dir, name+".sock")
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 4096
  nbthread 1
  stats socket %s mode 600 level admin
defaults
  mode tcp
  timeout connect 5s
  timeout client 4m
  timeout server 4m
  option splice-auto
%sfrontend fe
  bind %s
  default_backend be
backend be
  balance roundrobin
`, sock, extra, frontend)
	for i, be := range backends {
		fmt.Fprintf(&b, "  server s%d %s\n", i+1, be)
	}
	cfg := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("taskset", "-c", "0", "haproxy", "-db", "-f", cfg)
	log, _ := os.Create(filepath.Join(dir, name+".log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := t.startLB(cmd); err != nil {
		return nil, fmt.Errorf("starting haproxy (apt-get install haproxy): %w", err)
	}
	p := &lbProcess{name: name, cmd: cmd, frontend: frontend, dir: dir}
	admin := func(command string) error {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "%s\n", command); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		reply := make([]byte, 4096)
		n, _ := c.Read(reply)
		if s := strings.TrimSpace(string(reply[:n])); s != "" {
			return fmt.Errorf("haproxy: %s", s)
		}
		return nil
	}
	p.drain = func(i int) error { return admin(fmt.Sprintf("set server be/s%d state drain", i+1)) }
	p.undrain = func(i int) error { return admin(fmt.Sprintf("set server be/s%d state ready", i+1)) }
	if err := waitListening(t, frontend); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// freeAddr is a loopback address of its own and a port free on it.
func freeAddr() string {
	at, err := loopback.FreeAddr("tcp")
	if err != nil {
		panic(err)
	}
	return at.String()
}

// profileCPU saves a CPU profile of ebb taken over d to path.
func (p *lbProcess) profileCPU(t *topology, d time.Duration, path string) error {
	resp, err := t.lbHTTP().Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprof, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
