package localcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// envInNamespace marks a process that runs inside the private namespace made
// by Reexec, so that it does not re-execute itself again.
const envInNamespace = "EBB_LOCALCLUSTER_NAMESPACE"

// envHostUserNamespace marks a child of ReexecInHostUserNamespace: it kept
// the caller's user namespace.
const envHostUserNamespace = "EBB_LOCALCLUSTER_HOST_USERNS"

// Address ranges of every local cluster. They live on the loopback device of
// the cluster's own network namespace, so nothing here is reachable from, or
// collides with, the host or another cluster.
var (
	// NodeCIDR holds the simulated nodes' InternalIPs (10.0.0.1, 10.0.0.2, ...).
	NodeCIDR = mustCIDR("10.0.0.0/24")
	// PodCIDR holds pod IPs; node i gets 10.244.i.0/24.
	PodCIDR = mustCIDR("10.244.0.0/16")
	// ServiceCIDR is the kube-apiserver's --service-cluster-ip-range.
	ServiceCIDR = mustCIDR("10.96.0.0/20")
	// VIPCIDR is free for load-balancer VIPs (outside ServiceCIDR): 4,096
	// addresses, 10.96.240.0 to 10.96.255.255.
	VIPCIDR = mustCIDR("10.96.240.0/20")

	// The IPv6 ranges: every host, pod, Service and VIP range has one
	// (the cluster is dual-stack, IPv4 first).

	// NodeCIDRv6 holds the nodes' IPv6 InternalIPs (fd00:10::1, ...).
	NodeCIDRv6 = mustCIDR("fd00:10::/64")
	// PodCIDRv6 holds IPv6 pod IPs; node i gets fd00:244:0:i::/64 (i in hex).
	PodCIDRv6 = mustCIDR("fd00:244::/56")
	// ServiceCIDRv6 is the IPv6 half of --service-cluster-ip-range.
	ServiceCIDRv6 = mustCIDR("fd00:96::/112")
	// VIPCIDRv6 is free for IPv6 load-balancer VIPs (outside
	// ServiceCIDRv6): 65,536 addresses.
	VIPCIDRv6 = mustCIDR("fd00:96:240::/112")
)

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// InNamespace reports whether this process runs inside a private namespace
// made by Reexec (or by `ebb cluster up`).
func InNamespace() bool { return os.Getenv(envInNamespace) != "" }

// Reexec runs this program again, with the same arguments, inside a new user
// and network namespace, and returns its exit code. The child sees the
// marker from InNamespace and must call SetupNamespace before starting a
// cluster. It works unprivileged where the kernel allows user namespaces, and
// as root. Interrupts are passed on to the child.
func Reexec() (int, error) { return ReexecNotify(nil) }

// ReexecNotify is Reexec that calls started, if not nil, with the child's
// process ID (as the caller sees it) once it runs.
func ReexecNotify(started func(pid int)) (int, error) { return reexec(started, false) }

// ReexecInHostUserNamespace is Reexec for a caller that is root and whose
// cluster must keep the host's user namespace (new network, PID and mount
// namespaces only): eBPF (ebb lb --kernel-path=ebpf) needs CAP_BPF in the
// initial user namespace, which no process of a new one has. The child
// mounts a bpffs of its own at /sys/fs/bpf (SetupNamespace), so what the
// cluster pins goes with it.
func ReexecInHostUserNamespace() (int, error) { return ReexecInHostUserNamespaceNotify(nil) }

// ReexecInHostUserNamespaceNotify is ReexecInHostUserNamespace that calls
// started, if not nil, with the child's process ID once it runs.
func ReexecInHostUserNamespaceNotify(started func(pid int)) (int, error) {
	if os.Geteuid() != 0 {
		return 1, errors.New("a local cluster in the host's user namespace (real kubelets, eBPF) needs root: run as root, or leave Options.HostUserNamespace and RealKubelets unset")
	}
	return reexec(started, true)
}

func reexec(started func(pid int), hostUserNS bool) (int, error) {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envInNamespace+"=1")
	cmd.SysProcAttr = namespaceSysProcAttr()
	if hostUserNS {
		cmd.Env = append(cmd.Env, envHostUserNamespace+"=1")
		cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings, cmd.SysProcAttr.GidMappings = nil, nil
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 1, fmt.Errorf("starting %s in a new user and network namespace (does the kernel allow unprivileged user namespaces? see /proc/sys/kernel/unprivileged_userns_clone): %w", os.Args[0], err)
	}
	if started != nil {
		started(cmd.Process.Pid)
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("waiting for %s in its namespace: %w", os.Args[0], err)
	}
	return 0, nil
}

// namespaceSysProcAttr starts a child in new user, network, PID and mount
// namespaces in which it is root, mapped to the caller's own user.
func namespaceSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		// A new PID namespace makes the child its init: when it exits, for
		// whatever reason, the kernel kills every process it started, so no
		// cluster component outlives it. The mount namespace lets it mount a
		// /proc that matches those PIDs.
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
}

// SetupNamespace brings up loopback in the current (private) network
// namespace and puts the cluster's address ranges on it, so that any address
// in them can be bound and reached. It refuses to run outside a namespace
// made by Reexec: it would change the host's network.
func SetupNamespace() error {
	if !InNamespace() {
		return errors.New("refusing to configure the host network: SetupNamespace runs only inside the namespace made by localcluster.Reexec")
	}
	// Mount a /proc of our PID namespace, privately, so that /proc/PID of a
	// component we started is that component.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc for the cluster's PID namespace: %w", err)
	}
	if os.Getenv(envHostUserNamespace) != "" {
		// The host's bpffs is shared by every namespace: the cluster's pins
		// (ebb lb's maps and attachments) go in one of its own, which
		// vanishes with the cluster's mount namespace, leaving nothing on
		// the host.
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
			return fmt.Errorf("mounting a bpffs for the cluster at /sys/fs/bpf: %w", err)
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing loopback up: %w", err)
	}
	return nil
}

// NamespaceCommand prepares cmd to start in a new private namespace, like
// Reexec does, for a process that outlives its parent (`ebb cluster up`):
// it is put in a session of its own so a terminal's hang-up does not reach it.
func NamespaceCommand(cmd *exec.Cmd) {
	cmd.Env = append(cmd.Environ(), envInNamespace+"=1")
	cmd.SysProcAttr = namespaceSysProcAttr()
	cmd.SysProcAttr.Setsid = true
}

// NamespaceCommandInHostUserNamespace is NamespaceCommand keeping the
// caller's user namespace (the caller must be root), as real nodes
// (Options.RealKubelets) and the eBPF kernel path need.
func NamespaceCommandInHostUserNamespace(cmd *exec.Cmd) error {
	if os.Geteuid() != 0 {
		return errors.New("a local cluster in the host's user namespace (real kubelets, eBPF) needs root")
	}
	NamespaceCommand(cmd)
	cmd.Env = append(cmd.Env, envHostUserNamespace+"=1")
	cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWUSER
	cmd.SysProcAttr.UidMappings, cmd.SysProcAttr.GidMappings = nil, nil
	return nil
}
