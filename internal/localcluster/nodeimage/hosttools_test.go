package nodeimage

import (
	"strings"
	"testing"
)

func TestHostToolFilesCarryTheirLibrariesAndParents(t *testing.T) {
	// env is in coreutils, on every Debian machine, linked against libc.
	files, present, err := hostToolFiles([]HostTool{
		{Src: "/usr/bin/env", Path: "usr/bin/env"},
		{Src: "/nonexistent/tool", Path: "usr/bin/tool"},
	}, map[string]bool{"usr/": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(present) != 1 || present[0] != "usr/bin/env" {
		t.Fatalf("present %v, want only usr/bin/env", present)
	}
	seen := map[string]bool{}
	var libc, loader bool
	for _, f := range files {
		if seen[f.path] {
			t.Errorf("%s twice", f.path)
		}
		seen[f.path] = true
		if f.path == "usr/" {
			t.Errorf("usr/ again, which the image had")
		}
		if i := strings.LastIndex(strings.TrimSuffix(f.path, "/"), "/"); i > 0 && !seen[f.path[:i+1]] && f.path[:i+1] != "usr/" {
			t.Errorf("%s comes before its directory %s", f.path, f.path[:i+1])
		}
		libc = libc || strings.Contains(f.path, "libc.so")
		loader = loader || strings.Contains(f.path, "ld-linux")
		if !f.dir && f.src == "" {
			t.Errorf("%s has no source", f.path)
		}
	}
	if !seen["usr/bin/env"] || !libc || !loader {
		t.Errorf("files %v: want the program, libc and the dynamic loader", files)
	}
}
