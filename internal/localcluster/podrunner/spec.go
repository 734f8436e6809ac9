package podrunner

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// defaultCapabilities are what a container runtime (containerd, CRI-O)
// gives a container that asks for nothing else.
var defaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// containerSpec is how one container of pod runs: the sandbox of its
// process. volumes holds each volume's directory by name.
func containerSpec(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, img *Image, volumes map[string]string, service apiService) (*sandboxSpec, error) {
	env, err := containerEnv(ctx, client, pod, c, img, service)
	if err != nil {
		return nil, err
	}
	args := containerArgs(c, img)
	if len(args) == 0 {
		return nil, fmt.Errorf("container %s: neither the pod nor the image says what to run", c.Name)
	}
	mounts, err := containerMounts(c, volumes)
	if err != nil {
		return nil, err
	}
	caps, err := capabilities(c.SecurityContext)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	dir := img.Config.WorkingDir
	if c.WorkingDir != "" {
		dir = c.WorkingDir
	}
	sc := c.SecurityContext
	hostname := pod.Name
	if pod.Spec.HostNetwork {
		hostname = pod.Spec.NodeName
	}
	return &sandboxSpec{
		Hostname:     hostname,
		Root:         img.Root,
		ReadOnlyRoot: sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem,
		Mounts:       mounts,
		Args:         args,
		Env:          env,
		Dir:          dir,
		Capabilities: caps,
		NoNewPrivs:   sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
	}, nil
}

// containerArgs follows Kubernetes: command replaces the image's
// entrypoint, args its cmd; a command without args drops the image's cmd.
func containerArgs(c *corev1.Container, img *Image) []string {
	if len(c.Command) > 0 {
		return append(append([]string{}, c.Command...), c.Args...)
	}
	args := img.Config.Cmd
	if len(c.Args) > 0 {
		args = c.Args
	}
	return append(append([]string{}, img.Config.Entrypoint...), args...)
}

// apiService is where the `kubernetes` Service is, for
// KUBERNETES_SERVICE_HOST and _PORT.
type apiService struct {
	Host string
	Port int
}

// containerEnv is the image's environment, then a kubelet's (HOSTNAME, the
// kubernetes Service), then the container's own, each later one winning.
func containerEnv(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, img *Image, service apiService) ([]string, error) {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range img.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	set("HOSTNAME", pod.Name)
	if pod.Spec.HostNetwork {
		set("HOSTNAME", pod.Spec.NodeName)
	}
	set("KUBERNETES_SERVICE_HOST", service.Host)
	set("KUBERNETES_SERVICE_PORT", fmt.Sprint(service.Port))
	set("KUBERNETES_SERVICE_PORT_HTTPS", fmt.Sprint(service.Port))
	set("KUBERNETES_PORT", fmt.Sprintf("tcp://%s:%d", service.Host, service.Port))
	for _, e := range c.Env {
		v, err := envValue(ctx, client, pod, e)
		if err != nil {
			return nil, fmt.Errorf("container %s, variable %s: %w", c.Name, e.Name, err)
		}
		set(e.Name, v)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vars[k])
	}
	return env, nil
}

func envValue(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, e corev1.EnvVar) (string, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, nil
	case from.FieldRef != nil:
		return fieldValue(pod, from.FieldRef.FieldPath)
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("reading ConfigMap %s: %w", ref.Name, err)
		}
		return cm.Data[ref.Key], nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("reading Secret %s: %w", ref.Name, err)
		}
		return string(s.Data[ref.Key]), nil
	default:
		return "", fmt.Errorf("unsupported valueFrom (resource fields are not simulated)")
	}
}

// fieldValue is a downward API field of the pod.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		return joinIPs(pod.Status.HostIPs, func(ip corev1.HostIP) string { return ip.IP }, pod.Status.HostIP), nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return joinIPs(pod.Status.PodIPs, func(ip corev1.PodIP) string { return ip.IP }, pod.Status.PodIP), nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	return "", fmt.Errorf("unsupported field %q", path)
}

// joinIPs is a pod's addresses comma-separated, as the kubelet gives
// status.hostIPs and status.podIPs; the single address when the list is
// empty.
func joinIPs[T any](ips []T, ip func(T) string, single string) string {
	if len(ips) == 0 {
		return single
	}
	out := make([]string, len(ips))
	for i, v := range ips {
		out[i] = ip(v)
	}
	return strings.Join(out, ",")
}

func containerMounts(c *corev1.Container, volumes map[string]string) ([]mount, error) {
	var mounts []mount
	for _, vm := range c.VolumeMounts {
		dir, ok := volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %s mounts volume %s, which the pod does not have", c.Name, vm.Name)
		}
		if vm.SubPath != "" {
			dir = filepath.Join(dir, filepath.Clean("/"+vm.SubPath))
		}
		mounts = append(mounts, mount{Source: dir, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	return mounts, nil
}

// capabilities are the container's: the runtime's defaults, less what it
// drops (ALL: every one), plus what it adds.
func capabilities(sc *corev1.SecurityContext) ([]uintptr, error) {
	names := map[string]bool{}
	for _, n := range defaultCapabilities {
		names[n] = true
	}
	if sc != nil && sc.Capabilities != nil {
		for _, d := range sc.Capabilities.Drop {
			if strings.EqualFold(string(d), "ALL") {
				clear(names)
				continue
			}
			delete(names, capName(d))
		}
		for _, a := range sc.Capabilities.Add {
			names[capName(a)] = true
		}
	}
	var caps []uintptr
	for n := range names {
		c, ok := capabilityNumbers[n]
		if !ok {
			return nil, fmt.Errorf("unknown capability %q", n)
		}
		caps = append(caps, c)
	}
	return caps, nil
}

// capabilityNumbers are Linux's capabilities by name, without CAP_.
var capabilityNumbers = map[string]uintptr{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID, "KILL": unix.CAP_KILL, "SETGID": unix.CAP_SETGID,
	"SETUID": unix.CAP_SETUID, "SETPCAP": unix.CAP_SETPCAP, "LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"NET_ADMIN": unix.CAP_NET_ADMIN, "NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK,
	"IPC_OWNER": unix.CAP_IPC_OWNER, "SYS_MODULE": unix.CAP_SYS_MODULE, "SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"SYS_CHROOT": unix.CAP_SYS_CHROOT, "SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_PACCT": unix.CAP_SYS_PACCT,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_BOOT": unix.CAP_SYS_BOOT, "SYS_NICE": unix.CAP_SYS_NICE,
	"SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "SYS_TIME": unix.CAP_SYS_TIME, "SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG,
	"MKNOD": unix.CAP_MKNOD, "LEASE": unix.CAP_LEASE, "AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "SETFCAP": unix.CAP_SETFCAP, "MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"MAC_ADMIN": unix.CAP_MAC_ADMIN, "SYSLOG": unix.CAP_SYSLOG, "WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "AUDIT_READ": unix.CAP_AUDIT_READ, "PERFMON": unix.CAP_PERFMON,
	"BPF": unix.CAP_BPF, "CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// capName is a capability's name without the CAP_ prefix, upper case.
func capName(c corev1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}
