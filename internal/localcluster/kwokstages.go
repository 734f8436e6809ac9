package localcluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// kwokStages lists kwok's stage files from binDir (make tools copies
// kwok's own), with the pod-create stage made dual-stack: upstream's gives
// a pod one IP (podIP from the node's first pod CIDR, hostIP the node's
// first address), so a pod on a dual-stack node would have no IPv6 address
// and no IPv6 endpoint. The rewritten stage, written under dir, sets
// podIPs and hostIPs from every range of the node, as a dual-stack CNI
// plugin and kubelet do.
func kwokStages(binDir, dir string) ([]string, error) {
	stages, err := filepath.Glob(filepath.Join(binDir, "kwok-stages", "*.yaml"))
	if err != nil || len(stages) == 0 {
		return nil, fmt.Errorf("no kwok stage files in %s: run `make tools`", filepath.Join(binDir, "kwok-stages"))
	}
	sort.Strings(stages)
	for i, s := range stages {
		if filepath.Base(s) != podCreateStage {
			continue
		}
		data, err := os.ReadFile(s)
		if err != nil {
			return nil, fmt.Errorf("reading kwok's stage %s: %w", s, err)
		}
		dual, err := dualStackPodCreate(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		out := filepath.Join(dir, podCreateStage)
		if err := os.WriteFile(out, dual, 0o644); err != nil {
			return nil, fmt.Errorf("writing the dual-stack pod-create stage: %w", err)
		}
		stages[i] = out
	}
	return stages, nil
}

// podCreateStage is the file name make tools gives kwok's
// kustomize/stage/pod/general/pod-create.yaml.
const podCreateStage = "pod-general-pod-create.yaml"

// The single-address lines of kwok's pod-create stage and their
// dual-stack replacement (the form of kwok's own "fast" pod stages).
var (
	singleHostIP = []byte("      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}\n")
	singlePodIP  = []byte("      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid \"\" ) ( or .metadata.name \"\" ) ( or .metadata.namespace \"\" ) | Quote }}\n")
	dualIPs      = []byte(`      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
`)
)

// dualStackPodCreate rewrites kwok's pod-create stage to set every IP of
// the pod and its node. It fails, rather than run a cluster whose pods are
// silently single-stack, when the stage no longer has the lines it replaces
// (a new kwok version).
func dualStackPodCreate(stage []byte) ([]byte, error) {
	single := append(append([]byte{}, singleHostIP...), singlePodIP...)
	if bytes.Count(stage, single) != 1 {
		return nil, fmt.Errorf("kwok's pod-create stage does not set hostIP and podIP as expected (a new kwok version?): update dualStackPodCreate")
	}
	return bytes.Replace(stage, single, dualIPs, 1), nil
}
