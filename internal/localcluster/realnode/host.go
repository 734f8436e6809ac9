package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultCNIBinDir is where Debian's containernetworking-plugins puts the
// CNI reference plugins.
const DefaultCNIBinDir = "/usr/lib/cni"

// CheckHost says what the machine lacks to run real nodes, naming the
// Debian package that brings it (`make tools` installs them): runc, the CNI
// plugins, busybox-static (the app image's shell), and util-linux's unshare,
// nsenter and mount.
func CheckHost(cniBinDir string) error {
	var missing []string
	for _, p := range []struct{ prog, pkg string }{
		{"runc", "runc"},
		{"unshare", "util-linux"},
		{"nsenter", "util-linux"},
		{"mount", "mount"},
	} {
		if _, err := exec.LookPath(p.prog); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", p.prog, p.pkg))
		}
	}
	for _, plugin := range []string{"ptp", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			missing = append(missing, fmt.Sprintf("the CNI plugin %s in %s (Debian package containernetworking-plugins)", plugin, cniBinDir))
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		missing = append(missing, "/bin/busybox (Debian package busybox-static)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("the local cluster's real nodes need %s: run `make tools` as root, or apt-get install them", strings.Join(missing, ", "))
	}
	return nil
}
