package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/loopback"
)

// A restart on one host, process against process on loopback: ebb's
// hand-off (the new process takes the sockets), HAProxy's seamless reload
// (-x with expose-fd listeners, -sf), and a plain restart of ebb (stop,
// then start) as the baseline.

// restartResult is one contender's run.
type restartResult struct {
	Sent, Failed     int64
	LongLived        int
	LongLivedBroken  int
	FirstFailure     string
	RestartsMeasured int
}

// backends serves an HTTP answer and a byte echo, the two kinds of
// traffic of the run.
type backends struct{ http, echo []string }

func startBackends(n int) (*backends, func(), error) {
	b := &backends{}
	var closers []func()
	stop := func() {
		for _, c := range closers {
			c()
		}
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}\n") }), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		closers = append(closers, func() { _ = srv.Close() })
		b.http = append(b.http, ln.Addr().String())

		el, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		go func() {
			for {
				c, err := el.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(c, c); c.Close() }()
			}
		}()
		closers = append(closers, func() { _ = el.Close() })
		b.echo = append(b.echo, el.Addr().String())
	}
	return b, stop, nil
}

// contender restarts one kind of load balancer.
type contender struct {
	name string
	// start runs the first process; restart replaces the running one and
	// returns once the new one serves; wait waits for the old processes
	// to exit; stop ends everything.
	start, restart func() error
	wait, stop     func()
}

// frontends are the addresses clients use.
type frontends struct{ http, echo string }

func newFrontends() (frontends, error) {
	h, err := loopback.FreeAddr("tcp")
	if err != nil {
		return frontends{}, err
	}
	e, err := loopback.FreeAddr("tcp")
	if err != nil {
		return frontends{}, err
	}
	return frontends{http: h.String(), echo: e.String()}, nil
}

// runRestarts sends rate requests per second on new connections through
// c for the whole run and, around each of n restarts, long long-lived
// connections opened before it and closed once it is done.
func runRestarts(c contender, fe frontends, n, rate, long int) (restartResult, error) {
	if err := c.start(); err != nil {
		return restartResult{}, err
	}
	defer c.stop()
	if err := waitServing(fe.http); err != nil {
		return restartResult{}, err
	}
	reqs := &loadgen.Requests{URL: "http://" + fe.http + "/", Rate: rate}
	reqs.Start()
	var res restartResult
	for range n {
		var open []*loadgen.LongLived
		for range long {
			l, err := loadgen.OpenLongLived(fe.echo, 200*time.Millisecond)
			if err != nil {
				res.LongLivedBroken++
				continue
			}
			open = append(open, l)
		}
		time.Sleep(time.Second)
		if err := c.restart(); err != nil {
			reqs.Stop()
			return res, fmt.Errorf("%s: restarting: %w", c.name, err)
		}
		time.Sleep(time.Second)
		for _, l := range open {
			if why := l.Broken(); why != "" {
				res.LongLivedBroken++
				if res.FirstFailure == "" {
					res.FirstFailure = "long-lived: " + why
				}
			}
			l.Close()
		}
		res.LongLived += long
		res.RestartsMeasured++
		c.wait()
	}
	reqs.Stop()
	res.Sent, res.Failed = reqs.Counts()
	if res.Failed > 0 && res.FirstFailure == "" {
		res.FirstFailure = reqs.LastError()
	}
	return res, nil
}

func waitServing(addr string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("nothing serves %s", addr)
}

// procs are a contender's processes, newest last.
type procs struct {
	dir  string
	cmds []*exec.Cmd
	logs []string
}

func (p *procs) run(name string, args ...string) (*exec.Cmd, string, error) {
	log := filepath.Join(p.dir, fmt.Sprintf("%s-%d.log", filepath.Base(name), len(p.cmds)))
	f, err := os.Create(log)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); f.Close() }()
	p.cmds, p.logs = append(p.cmds, cmd), append(p.logs, log)
	return cmd, log, nil
}

// waitOld waits until every process but the newest has exited (killing
// what is left after 30 s).
func (p *procs) waitOld() {
	for _, cmd := range p.cmds[:max(len(p.cmds)-1, 0)] {
		waitExit(cmd, 30*time.Second)
	}
}

func (p *procs) stopAll() {
	for _, cmd := range p.cmds {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, cmd := range p.cmds {
		waitExit(cmd, 10*time.Second)
	}
}

func waitExit(cmd *exec.Cmd, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cmd.ProcessState != nil || cmd.Process.Signal(syscall.Signal(0)) != nil {
			return
		}
	}
	_ = cmd.Process.Kill()
}

// waitLog waits until a process's log says what.
func waitLog(path, what string, d time.Duration) error {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		data, _ := os.ReadFile(path)
		if strings.Contains(string(data), what) {
			return nil
		}
	}
	return fmt.Errorf("%s does not say %q", path, what)
}

// haproxyPID asks HAProxy's stats socket which process answers it.
func haproxyPID(sock string) (int, error) {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "show info\n"); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid: "); ok {
			var pid int
			_, err := fmt.Sscan(v, &pid)
			return pid, err
		}
	}
	return 0, fmt.Errorf("no Pid in show info")
}
