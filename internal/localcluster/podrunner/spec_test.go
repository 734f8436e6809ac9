package podrunner

import (
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"golang.org/x/sys/unix"
)

func TestContainerArgsFollowKubernetes(t *testing.T) {
	img := &Image{Config: v1.Config{Entrypoint: []string{"/ebb"}, Cmd: []string{"--help"}}}
	tests := []struct {
		name    string
		command []string
		args    []string
		want    []string
	}{
		{"image's entrypoint and cmd", nil, nil, []string{"/ebb", "--help"}},
		{"args replace cmd", nil, []string{"lb"}, []string{"/ebb", "lb"}},
		{"command replaces both", []string{"/bin/sh"}, nil, []string{"/bin/sh"}},
		{"command and args", []string{"/bin/sh"}, []string{"-c", "x"}, []string{"/bin/sh", "-c", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := containerArgs(&corev1.Container{Command: tt.command, Args: tt.args}, img)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCapabilitiesFromTheSecurityContext(t *testing.T) {
	tests := []struct {
		name string
		sc   *corev1.SecurityContext
		want []uintptr
		not  []uintptr
	}{
		{"runtime defaults", nil, []uintptr{unix.CAP_CHOWN, unix.CAP_NET_BIND_SERVICE}, []uintptr{unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN}},
		{"drop ALL, add two", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN", "CAP_NET_BIND_SERVICE"}}},
			[]uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_BIND_SERVICE}, []uintptr{unix.CAP_CHOWN, unix.CAP_NET_RAW}},
		{"drop one", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}},
			[]uintptr{unix.CAP_CHOWN}, []uintptr{unix.CAP_NET_RAW}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := capabilities(tt.sc)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range tt.want {
				if !slices.Contains(got, c) {
					t.Errorf("capability %d missing from %v", c, got)
				}
			}
			for _, c := range tt.not {
				if slices.Contains(got, c) {
					t.Errorf("capability %d kept in %v", c, got)
				}
			}
		})
	}
	if _, err := capabilities(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"FLY"}}}); err == nil {
		t.Error("an unknown capability was accepted")
	}
}

func TestContainerEnvHasTheDownwardAPIAndTheKubernetesService(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-x", Namespace: "ebb-system", Labels: map[string]string{"app": "lb"}},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{HostIP: "10.0.0.1", HostIPs: []corev1.HostIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}, PodIP: "10.244.1.5"},
	}
	c := &corev1.Container{Name: "lb", Env: []corev1.EnvVar{
		{Name: "NODE_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIPs"}}},
		{Name: "POD_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "NODE_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		{Name: "PATH", Value: "/custom"},
	}}
	img := &Image{Config: v1.Config{Env: []string{"PATH=/usr/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca.crt"}}}
	env, err := containerEnv(t.Context(), fake.NewClientset(), pod, c, img, apiService{Host: "10.96.0.1", Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NODE_IPS=10.0.0.1,fd00::1", "POD_IPS=10.244.1.5", "POD_NAME=lb-x", "NODE_IP=10.0.0.1", "APP=lb", "PATH=/custom", "SSL_CERT_FILE=/etc/ssl/certs/ca.crt", "HOSTNAME=lb-x", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"} {
		if !slices.Contains(env, want) {
			t.Errorf("%s missing from %v", want, env)
		}
	}
	c.Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}}}
	if _, err := containerEnv(t.Context(), fake.NewClientset(), pod, c, img, apiService{}); err == nil {
		t.Error("an unsupported valueFrom was accepted")
	}
}

func TestStatusMatchesIgnoresOnlyWhatDoesNotMatter(t *testing.T) {
	started := metav1.Now()
	base := &corev1.PodStatus{
		Phase:      corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}},
	}
	tests := []struct {
		name   string
		change func(*corev1.PodStatus)
		match  bool
	}{
		{"same", func(*corev1.PodStatus) {}, true},
		{"another message", func(s *corev1.PodStatus) { s.Conditions[0].Message = "x" }, true},
		{"kwok's Ready before the probe", func(s *corev1.PodStatus) { s.ContainerStatuses[0].Ready = false }, false},
		{"a restart", func(s *corev1.PodStatus) { s.ContainerStatuses[0].RestartCount = 1 }, false},
		{"pending", func(s *corev1.PodStatus) { s.Phase = corev1.PodPending }, false},
		{"not ready", func(s *corev1.PodStatus) { s.Conditions[0].Status = corev1.ConditionFalse }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := base.DeepCopy()
			tt.change(got)
			if m := statusMatches(got, base); m != tt.match {
				t.Errorf("statusMatches = %v, want %v", m, tt.match)
			}
		})
	}
}
