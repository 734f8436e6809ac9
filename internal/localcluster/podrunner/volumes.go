package podrunner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tokenSource is a projected service-account token file to keep fresh.
type tokenSource struct {
	path string
	pod  *corev1.Pod
	src  *corev1.ServiceAccountTokenProjection
}

// volumeMaker writes a pod's volumes under dir, as a kubelet's volume
// manager does: emptyDir, hostPath, configMap, secret, downwardAPI and
// projected (the service-account token admission adds to every pod).
type volumeMaker struct {
	client kubernetes.Interface
	dir    string
	tokens []tokenSource
}

// make returns each volume's directory by name.
func (m *volumeMaker) make(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	dirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			// As the kubelet does: DirectoryOrCreate makes the directory,
			// 0755, owned by the kubelet's user.
			if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate {
				if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
					return nil, fmt.Errorf("creating hostPath volume %s: %w", v.Name, err)
				}
			}
			dirs[v.Name] = v.HostPath.Path
			continue
		}
		dir := filepath.Join(m.dir, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating volume %s: %w", v.Name, err)
		}
		dirs[v.Name] = dir
		var err error
		switch {
		case v.EmptyDir != nil:
		case v.ConfigMap != nil:
			err = m.configMap(ctx, pod, dir, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		case v.Secret != nil:
			err = m.secret(ctx, pod, dir, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
		case v.DownwardAPI != nil:
			err = m.downward(pod, dir, v.DownwardAPI.Items)
		case v.Projected != nil:
			err = m.projected(ctx, pod, dir, v.Projected.Sources)
		default:
			err = fmt.Errorf("this volume type is not supported by the local cluster")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return dirs, nil
}

func (m *volumeMaker) projected(ctx context.Context, pod *corev1.Pod, dir string, sources []corev1.VolumeProjection) error {
	for _, s := range sources {
		var err error
		switch {
		case s.ServiceAccountToken != nil:
			t := tokenSource{path: filepath.Join(dir, s.ServiceAccountToken.Path), pod: pod, src: s.ServiceAccountToken}
			m.tokens = append(m.tokens, t)
			_, err = m.writeToken(ctx, t)
		case s.ConfigMap != nil:
			err = m.configMap(ctx, pod, dir, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional)
		case s.Secret != nil:
			err = m.secret(ctx, pod, dir, s.Secret.Name, s.Secret.Items, s.Secret.Optional)
		case s.DownwardAPI != nil:
			err = m.downward(pod, dir, s.DownwardAPI.Items)
		default:
			err = fmt.Errorf("unsupported projection")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeToken asks the apiserver for a token bound to the pod, as a kubelet
// does, writes it and returns when it should be renewed (at 80% of its
// life, as the kubelet renews).
func (m *volumeMaker) writeToken(ctx context.Context, t tokenSource) (time.Duration, error) {
	expiry := int64(3600)
	if t.src.ExpirationSeconds != nil {
		expiry = *t.src.ExpirationSeconds
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &expiry,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: t.pod.Name, UID: t.pod.UID},
	}}
	if t.src.Audience != "" {
		req.Spec.Audiences = []string{t.src.Audience}
	}
	sa := t.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tok, err := m.client.CoreV1().ServiceAccounts(t.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("requesting a token for service account %s/%s: %w", t.pod.Namespace, sa, err)
	}
	if err := writeFile(t.path, []byte(tok.Status.Token)); err != nil {
		return 0, err
	}
	return time.Duration(expiry) * time.Second * 8 / 10, nil
}

// refreshTokens renews the pod's tokens until ctx is done.
func (m *volumeMaker) refreshTokens(ctx context.Context, renewEvery func(error)) {
	for _, t := range m.tokens {
		go func() {
			wait := time.Duration(0)
			for {
				timer := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					timer.Stop()
					return
				case <-timer.C:
				}
				next, err := m.writeToken(ctx, t)
				renewEvery(err)
				if err != nil {
					next = 10 * time.Second
				}
				wait = next
			}
		}()
	}
}

func (m *volumeMaker) configMap(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	cm, err := m.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("reading ConfigMap %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return writeKeys(dir, data, items)
}

func (m *volumeMaker) secret(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	s, err := m.client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("reading Secret %s: %w", name, err)
	}
	return writeKeys(dir, s.Data, items)
}

func (m *volumeMaker) downward(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downward API %s: only fieldRef is supported", it.Path)
		}
		v, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, it.Path), []byte(v)); err != nil {
			return err
		}
	}
	return nil
}

// writeKeys writes data's keys, or only items (key to path) if any.
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath) error {
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(filepath.Join(dir, k), v); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("no key %s", it.Key)
		}
		if err := writeFile(filepath.Join(dir, it.Path), v); err != nil {
			return err
		}
	}
	return nil
}

// writeFile replaces path at once (write, then rename), so a reader never
// sees half a token.
func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
