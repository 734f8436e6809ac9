package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImageLinksNoTestTooling guards the image's binary: a package that
// runs at start-up for tests only (envtest creates directories in its
// init and panics on a read-only filesystem) must not be in it.
func TestImageLinksNoTestTooling(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "ebb_image", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"sigs.k8s.io/controller-runtime/pkg/envtest", "/internal/localcluster", "/internal/demo", "\ttesting"} {
			if strings.Contains(pkg, banned) || pkg == "testing" {
				t.Errorf("the image's binary links %s", pkg)
			}
		}
	}
}
