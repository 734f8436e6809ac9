package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// makeTools writes a tools directory with every required binary (empty
// files: only their presence is checked) under cache, modified at mtime.
func makeTools(t *testing.T, cache, key string, mtime time.Time, skip ...string) string {
	t.Helper()
	dir := filepath.Join(cache, "tools", key, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range requiredBinaries {
		if len(skip) > 0 && skip[0] == b {
			continue
		}
		p := filepath.Join(dir, b)
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Outside a checkout the tools come from $EBB_TOOLS_BIN, else the newest
// complete build in the cache; with neither, the error says what to do.
func TestFindBinDirOutsideACheckout(t *testing.T) {
	t.Chdir(t.TempDir()) // no hack/tools.sh above
	cache := t.TempDir()
	t.Setenv("EBB_CACHE", cache)
	t.Setenv(EnvToolsBin, "")

	if _, err := FindBinDir(); err == nil || !strings.Contains(err.Error(), "--tools-bin") {
		t.Fatalf("an empty cache: %v, want an error naming --tools-bin", err)
	}
	now := time.Now()
	old := makeTools(t, cache, "kube-v1.35.0-aaaa", now.Add(-time.Hour))
	newest := makeTools(t, cache, "kube-v1.36.3-bbbb", now)
	makeTools(t, cache, "kube-v1.36.3-cccc", now.Add(time.Hour), "kwok") // incomplete
	if got, err := FindBinDir(); err != nil || got != newest {
		t.Errorf("from the cache: %q %v, want the newest complete build %q", got, err, newest)
	}
	t.Setenv(EnvToolsBin, old)
	if got, err := FindBinDir(); err != nil || got != old {
		t.Errorf("with %s: %q %v, want %q", EnvToolsBin, got, err, old)
	}
	if err := CheckBinDir(filepath.Join(cache, "tools", "kube-v1.36.3-cccc", "bin")); err == nil || !strings.Contains(err.Error(), "kwok not found") {
		t.Errorf("an incomplete directory: %v", err)
	}
}
