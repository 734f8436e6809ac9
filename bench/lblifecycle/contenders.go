package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ebbConfig serves both frontends, round robin over the backends.
func ebbConfig(fe frontends, b *backends) string {
	var s strings.Builder
	s.WriteString("frontends:\n")
	for _, f := range []struct {
		name, addr string
		backends   []string
	}{{"http", fe.http, b.http}, {"echo", fe.echo, b.echo}} {
		host, port, _ := net.SplitHostPort(f.addr)
		fmt.Fprintf(&s, "- name: %s\n  address: %s\n  port: %s\n  backends:\n", f.name, host, port)
		for _, be := range f.backends {
			h, p, _ := net.SplitHostPort(be)
			fmt.Fprintf(&s, "  - {address: %s, port: %s}\n", h, p)
		}
	}
	return s.String()
}

// ebbContender restarts `ebb lb`: with handoff, the new process starts
// beside the old one and takes its sockets (the old one exits once its
// connections end); without, the old one is stopped (SIGTERM: it stops
// accepting and closes what is left after 2 s, as a restart must bound)
// and the new one started after it exited.
func ebbContender(ebbBin, dir string, fe frontends, b *backends, handoff bool) (contender, error) {
	file := filepath.Join(dir, "ebb.yaml")
	if err := os.WriteFile(file, []byte(ebbConfig(fe, b)), 0o644); err != nil {
		return contender{}, err
	}
	p := &procs{dir: dir}
	socket := ""
	name := "ebb-restart"
	if handoff {
		socket = fmt.Sprintf("@ebb-bench-lifecycle-%d", os.Getpid())
		name = "ebb-handoff"
	}
	start := func() (string, error) {
		_, log, err := p.run(ebbBin, "lb", "--config", file, "--metrics-bind-address", "", "--poll-interval", "1h",
			"--handoff-socket", socket, "--shutdown-timeout", "2s")
		return log, err
	}
	c := contender{name: name, wait: p.waitOld, stop: p.stopAll}
	c.start = func() error { _, err := start(); return err }
	c.restart = func() error {
		if handoff {
			log, err := start()
			if err != nil {
				return err
			}
			return waitLog(log, "Took over from the predecessor", 10*time.Second)
		}
		old := p.cmds[len(p.cmds)-1]
		_ = old.Process.Signal(syscall.SIGTERM)
		waitExit(old, 10*time.Second)
		if _, err := start(); err != nil {
			return err
		}
		return waitServing(fe.http)
	}
	return c, nil
}

// haproxyContender reloads HAProxy 2.6 seamlessly: the new process takes
// the listeners from the old one's stats socket (-x, expose-fd listeners)
// and tells it to finish its connections and leave (-sf).
func haproxyContender(dir string, fe frontends, b *backends) (contender, error) {
	sock := filepath.Join(dir, "haproxy.sock")
	var s strings.Builder
	fmt.Fprintf(&s, `global
  maxconn 4096
  stats socket %s mode 600 level admin expose-fd listeners
defaults
  mode tcp
  timeout connect 5s
  timeout client 4m
  timeout server 4m
`, sock)
	for _, f := range []struct {
		name, addr string
		backends   []string
	}{{"http", fe.http, b.http}, {"echo", fe.echo, b.echo}} {
		fmt.Fprintf(&s, "listen %s\n  bind %s\n  balance roundrobin\n", f.name, f.addr)
		for i, be := range f.backends {
			fmt.Fprintf(&s, "  server s%d %s\n", i+1, be)
		}
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(s.String()), 0o644); err != nil {
		return contender{}, err
	}
	p := &procs{dir: dir}
	c := contender{name: "haproxy-reload", wait: p.waitOld, stop: p.stopAll}
	c.start = func() error {
		if _, _, err := p.run("haproxy", "-db", "-f", cfg); err != nil {
			return fmt.Errorf("%w (apt-get install haproxy)", err)
		}
		return nil
	}
	c.restart = func() error {
		old := p.cmds[len(p.cmds)-1]
		cmd, _, err := p.run("haproxy", "-db", "-f", cfg, "-x", sock, "-sf", strconv.Itoa(old.Process.Pid))
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if pid, err := haproxyPID(sock); err == nil && pid == cmd.Process.Pid {
				return nil
			}
		}
		return fmt.Errorf("the new HAProxy (pid %d) does not answer its stats socket", cmd.Process.Pid)
	}
	return c, nil
}
