package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Restart back-off after a container exits: a kubelet starts at 10 s; the
// local cluster starts lower so that tests of a crash are short.
const (
	restartBackoffFirst = time.Second
	restartBackoffMax   = 30 * time.Second
)

// podRun is one running pod: its network, volumes and containers.
type podRun struct {
	r   *Runner
	log logr.Logger

	// stopping is closed when the pod must stop: deleted, or the runner
	// is going away (then kill is set too).
	stopping  chan struct{}
	stopOnce  sync.Once
	statusDue chan struct{}

	mu         sync.Mutex
	pod        *corev1.Pod
	killNow    bool
	grace      time.Duration
	containers []*containerState
}

// containerState is what the pod's status says of one container.
type containerState struct {
	name, image, imageID string
	running              bool
	startedAt            metav1.Time
	ready                bool
	restarts             int32
	waiting              string // a reason, when not running
	waitingMessage       string
	last                 *corev1.ContainerStateTerminated
}

func newPodRun(r *Runner, pod *corev1.Pod, log logr.Logger) *podRun {
	p := &podRun{r: r, log: log, pod: pod.DeepCopy(), stopping: make(chan struct{}), statusDue: make(chan struct{}, 1)}
	for _, c := range pod.Spec.Containers {
		p.containers = append(p.containers, &containerState{name: c.Name, image: c.Image, waiting: "ContainerCreating"})
	}
	return p
}

// update takes a newer version of the pod from the API.
func (p *podRun) update(pod *corev1.Pod) {
	p.mu.Lock()
	p.pod = pod.DeepCopy()
	p.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		grace := time.Duration(0)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		p.stop(grace, false)
		return
	}
	// Someone else (kwok) may have written the status: put ours back.
	p.statusChanged()
}

// deleted stops a pod that vanished from the API without a graceful
// deletion seen first: with the grace period of its spec.
func (p *podRun) deleted() {
	p.mu.Lock()
	grace := time.Duration(30) * time.Second
	if s := p.pod.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}
	p.mu.Unlock()
	p.stop(grace, false)
}

// kill stops the pod at once: the cluster is going away.
func (p *podRun) kill() { p.stop(0, true) }

func (p *podRun) stop(grace time.Duration, kill bool) {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.grace, p.killNow = grace, kill
		p.mu.Unlock()
		close(p.stopping)
	})
}

func (p *podRun) current() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pod
}

func (p *podRun) statusChanged() {
	select {
	case p.statusDue <- struct{}{}:
	default:
	}
}

// run sets the pod up, runs its containers until it must stop, stops them
// and tears the pod down.
func (p *podRun) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		p.writeStatuses(ctx)
	}()
	pod := p.current()
	dir := filepath.Join(p.r.opts.Dir, string(pod.UID))
	defer func() { _ = os.RemoveAll(dir) }()
	var err error

	// The pod's sandbox, as a kubelet makes it before any container:
	// its network, then its volumes; retried until they can be made.
	var net *network.Host
	var volumes map[string]string
	var closeNet func()
	volumeMaker := &volumeMaker{client: p.r.opts.Client, dir: filepath.Join(dir, "volumes")}
	for {
		net, closeNet, volumes, err = p.sandbox(ctx, pod, volumeMaker)
		if err == nil {
			break
		}
		p.failed("FailedCreatePodSandBox", err)
		select {
		case <-p.stopping:
			cancel()
			<-statusDone
			return
		case <-time.After(5 * time.Second):
		}
	}
	defer closeNet()
	volumeMaker.refreshTokens(ctx, func(err error) {
		if err != nil {
			p.log.Info("Renewing a service-account token failed", "err", err.Error())
		}
	})

	var wg sync.WaitGroup
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		st := p.containers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.supervise(ctx, c, st, net, volumes)
		}()
	}
	wg.Wait()
	cancel()
	<-statusDone
}

// sandbox makes the pod's network and volumes; undo undoes the network.
func (p *podRun) sandbox(ctx context.Context, pod *corev1.Pod, vm *volumeMaker) (net *network.Host, undo func(), volumes map[string]string, err error) {
	net, undo, err = p.network(pod)
	if err != nil {
		return nil, nil, nil, err
	}
	vm.tokens = nil
	if volumes, err = vm.make(ctx, pod); err != nil {
		undo()
		return nil, nil, nil, err
	}
	return net, undo, volumes, nil
}

// network is where the pod's processes run: its node's host, or a
// network namespace of its own with its pod IP.
func (p *podRun) network(pod *corev1.Pod) (*network.Host, func(), error) {
	node, ok := p.r.opts.Machines.Host(pod.Spec.NodeName)
	if !ok {
		return nil, nil, fmt.Errorf("node %s has no host", pod.Spec.NodeName)
	}
	if pod.Spec.HostNetwork {
		return node, func() {}, nil
	}
	raw := []string{pod.Status.PodIP}
	if len(pod.Status.PodIPs) > 0 {
		raw = raw[:0]
		for _, ip := range pod.Status.PodIPs {
			raw = append(raw, ip.IP)
		}
	}
	ips := make([]netip.Addr, 0, len(raw))
	for _, s := range raw {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, nil, fmt.Errorf("pod IP %q: %w", s, err)
		}
		ips = append(ips, ip)
	}
	ns, err := p.r.opts.Machines.AddPod(node, pod.Namespace+"/"+pod.Name, ips...)
	if err != nil {
		return nil, nil, fmt.Errorf("making the pod's network: %w", err)
	}
	return ns.Host, ns.Close, nil
}

// failed reports a pod that cannot start yet: a Warning event, and the
// reason in its containers' waiting state.
func (p *podRun) failed(reason string, err error) {
	p.log.Info("Pod cannot start", "reason", reason, "err", err.Error())
	p.r.recorder.Event(p.current(), corev1.EventTypeWarning, reason, err.Error())
	p.mu.Lock()
	for _, c := range p.containers {
		if !c.running {
			c.waiting, c.waitingMessage = reason, err.Error()
		}
	}
	p.mu.Unlock()
	p.statusChanged()
}

// supervise runs one container, restarting it when it exits, until the pod
// stops.
func (p *podRun) supervise(ctx context.Context, c *corev1.Container, st *containerState, net *network.Host, volumes map[string]string) {
	backoff := restartBackoffFirst
	for {
		cmd, err := p.start(ctx, c, net, volumes)
		if err != nil {
			p.failed("Failed", fmt.Errorf("container %s: %w", c.Name, err))
		} else {
			exited := p.watch(ctx, c, st, cmd, net)
			if exited == nil {
				return // stopped with the pod
			}
			p.mu.Lock()
			st.running, st.ready, st.last = false, false, exited
			st.restarts++
			st.waiting, st.waitingMessage = "CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container %s", backoff, c.Name)
			p.mu.Unlock()
			p.statusChanged()
			p.r.recorder.Eventf(p.current(), corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s (exit code %d)", c.Name, exited.ExitCode)
		}
		select {
		case <-p.stopping:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

// start starts the container's process in its sandbox (see sandbox.go).
func (p *podRun) start(ctx context.Context, c *corev1.Container, net *network.Host, volumes map[string]string) (*exec.Cmd, error) {
	pod := p.current()
	img, ok, err := p.r.opts.Images.Resolve(c.Image)
	if err != nil || !ok {
		return nil, fmt.Errorf("image %s: not in the local image store (%v)", c.Image, err)
	}
	spec, err := containerSpec(ctx, p.r.opts.Client, pod, c, img, volumes, apiService{Host: p.r.opts.APIServerHost, Port: p.r.opts.APIServerPort})
	if err != nil {
		return nil, err
	}
	if err := makeMountPoints(img.Root, spec); err != nil {
		return nil, err
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(p.r.opts.LogDir, fmt.Sprintf("%s_%s_%s.log", pod.Namespace, pod.Name, c.Name))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the container's log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{fmt.Sprintf("container %s/%s/%s", pod.Namespace, pod.Name, c.Name)}
	cmd.Env = []string{envSandbox + "=" + string(specJSON)}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Mount and UTS (hostname) namespaces of its own; the parent-death
	// signal kills it with the cluster; its own process group, so that
	// stopping it stops anything it forked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := net.Start(cmd); err != nil {
		return nil, fmt.Errorf("starting the container's process: %w", err)
	}
	p.r.recorder.Eventf(pod, corev1.EventTypeNormal, "Started", "Started container %s (pid %d on %s)", c.Name, cmd.Process.Pid, net.Name)
	return cmd, nil
}

// makeMountPoints creates, in the image's unpacked filesystem, the
// directories the sandbox mounts onto; none may lead out of it.
func makeMountPoints(root string, spec *sandboxSpec) error {
	targets := []string{"/proc"}
	for _, m := range spec.Mounts {
		targets = append(targets, m.Target)
	}
	for _, t := range targets {
		dir := filepath.Join(root, filepath.Clean("/"+t))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating the mount point %s: %w", t, err)
		}
		real, err := filepath.EvalSymlinks(dir)
		if err != nil || !strings.HasPrefix(real+"/", root+"/") {
			return fmt.Errorf("mount point %s leads out of the image's filesystem", t)
		}
	}
	return nil
}

// watch follows a started container until it exits (returning how) or the
// pod stops (stopping it and returning nil). It runs the probes meanwhile.
func (p *podRun) watch(ctx context.Context, c *corev1.Container, st *containerState, cmd *exec.Cmd, net *network.Host) *corev1.ContainerStateTerminated {
	started := metav1.Now()
	p.mu.Lock()
	st.running, st.startedAt, st.waiting, st.waitingMessage = true, started, "", ""
	img, _, _ := p.r.opts.Images.Resolve(c.Image)
	if img != nil {
		st.imageID = c.Image + "@" + img.Digest.String()
	}
	st.ready = c.ReadinessProbe == nil
	p.mu.Unlock()
	p.statusChanged()

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	unhealthy := make(chan struct{}, 1)
	p.startProbes(probeCtx, c, st, net, unhealthy)

	select {
	case err := <-exited:
		return terminated(err, started)
	case <-unhealthy:
		p.r.recorder.Eventf(p.current(), corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted", c.Name)
		p.terminate(c, cmd, exited, p.specGrace())
		return &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", Message: "liveness probe failed", StartedAt: started, FinishedAt: metav1.Now()}
	case <-p.stopping:
		p.mu.Lock()
		grace, kill := p.grace, p.killNow
		p.mu.Unlock()
		if kill {
			grace = 0
		} else {
			p.r.recorder.Eventf(p.current(), corev1.EventTypeNormal, "Killing", "Stopping container %s", c.Name)
		}
		p.terminate(c, cmd, exited, grace)
		return nil
	}
}

func (p *podRun) specGrace() time.Duration {
	if s := p.current().Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second
}

// terminate stops a container as a kubelet does: its preStop sleep, then
// SIGTERM, then SIGKILL to its process group at the end of the grace
// period (counted from the start of termination).
func (p *podRun) terminate(c *corev1.Container, cmd *exec.Cmd, exited <-chan error, grace time.Duration) {
	deadline := time.After(grace)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil && grace > 0 {
		select {
		case <-time.After(time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second):
		case <-deadline:
		case <-exited:
			return
		}
	}
	if grace > 0 {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return
		case <-deadline:
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// terminated describes how a process ended.
func terminated(err error, started metav1.Time) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: started, FinishedAt: metav1.Now()}
	if exit, ok := err.(*exec.ExitError); ok {
		t.ExitCode, t.Reason = int32(exit.ExitCode()), "Error"
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.ExitCode = 128 + int32(ws.Signal())
		}
	} else if err != nil {
		t.ExitCode, t.Reason, t.Message = 128, "Error", err.Error()
	}
	return t
}

// startProbes runs the container's readiness probe (its result is the
// container's readiness) and liveness probe (a failure signals unhealthy).
func (p *podRun) startProbes(ctx context.Context, c *corev1.Container, st *containerState, net *network.Host, unhealthy chan<- struct{}) {
	pod := p.current()
	if c.ReadinessProbe != nil {
		pr := &prober{probe: c.ReadinessProbe, pod: pod, c: c, net: net}
		go pr.run(ctx, false, func(ok bool, msg string) {
			p.mu.Lock()
			st.ready = ok
			p.mu.Unlock()
			p.statusChanged()
			if !ok {
				p.r.recorder.Eventf(pod, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %s", msg)
			}
		})
	}
	if c.LivenessProbe != nil {
		pr := &prober{probe: c.LivenessProbe, pod: pod, c: c, net: net}
		go pr.run(ctx, true, func(ok bool, msg string) {
			if ok {
				return
			}
			p.r.recorder.Eventf(pod, corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed: %s", msg)
			select {
			case unhealthy <- struct{}{}:
			default:
			}
		})
	}
}
