package nodeimage

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// HostTool is a dynamically linked program of this machine that the app
// image carries, with the shared libraries it loads, where Kubernetes' own
// e2e cases need more than busybox gives: they run `wget -T 5` (Debian's
// static busybox crashes on -T), OpenBSD nc (`nc -v -u -w 2`; busybox's
// has none of those options) and curl in the app's pods, as upstream's
// Alpine-based agnhost image has them, through `/bin/sh -c`. The shell is
// dash: busybox's runs its own applets before anything on the PATH.
type HostTool struct {
	// Src is the program on this machine; Path is where the image has it.
	Src, Path string
}

// AppTools are the host tools the app image carries when this machine has
// them (dash always; hack/upstream-e2e.sh installs the Debian packages wget,
// netcat-openbsd and curl, at these paths). Every real node's app pods get
// them: Kubernetes' own e2e cases need them; ebb's own suites' pods run
// `/bin/sh -c` with sleep and `wget -q -O`, which dash and GNU wget run as
// busybox did.
var AppTools = []HostTool{
	{Src: "/bin/dash", Path: "bin/sh"},
	{Src: "/usr/bin/wget", Path: "usr/bin/wget"},
	{Src: "/bin/nc.openbsd", Path: "usr/bin/nc"},
	{Src: "/usr/bin/curl", Path: "usr/bin/curl"},
}

// hostToolFiles returns the files of the tools this machine has: each
// program and every shared library `ldd` says it loads (the dynamic loader
// included), at the same absolute paths as here, each library once. The
// image's /usr/bin comes before /bin in its PATH, so these shadow busybox's
// applets of the same names.
//
// have are the directories the image has already.
func hostToolFiles(tools []HostTool, have map[string]bool) ([]file, []string, error) {
	var found []HostTool
	var present []string
	libs := map[string]bool{}
	for _, t := range tools {
		if _, err := os.Stat(t.Src); err != nil {
			continue
		}
		found = append(found, t)
		present = append(present, t.Path)
		deps, err := sharedLibraries(t.Src)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	var files []file
	dirs := map[string]bool{}
	for d := range have {
		dirs[d] = true
	}
	// add puts a file in, its parent directories first, each once: the
	// layer must create them before the files in them.
	add := func(rel, src string) error {
		var parents []string
		for d := filepath.Dir(rel); d != "." && d != "/"; d = filepath.Dir(d) {
			parents = append([]string{d + "/"}, parents...)
		}
		for _, p := range parents {
			if !dirs[p] {
				dirs[p] = true
				files = append(files, file{path: p, dir: true, mode: 0o755})
			}
		}
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", src, err)
		}
		files = append(files, file{path: rel, mode: 0o755, src: real})
		return nil
	}
	for _, t := range found {
		if err := add(t.Path, t.Src); err != nil {
			return nil, nil, err
		}
	}
	sorted := make([]string, 0, len(libs))
	for l := range libs {
		sorted = append(sorted, l)
	}
	sort.Strings(sorted)
	for _, l := range sorted {
		if err := add(strings.TrimPrefix(l, "/"), l); err != nil {
			return nil, nil, err
		}
	}
	return files, present, nil
}

// sharedLibraries lists the absolute paths of the shared libraries a
// program loads, as ldd resolves them on this machine.
func sharedLibraries(program string) ([]string, error) {
	out, err := exec.Command("ldd", program).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil // static: nothing to carry
		}
		return nil, fmt.Errorf("listing the shared libraries of %s with ldd: %w: %s", program, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libbsd.so.0 => /lib/x86_64-linux-gnu/libbsd.so.0 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 3 && fields[1] == "=>" && strings.HasPrefix(fields[2], "/"):
			libs = append(libs, fields[2])
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			libs = append(libs, fields[0])
		case len(fields) >= 3 && fields[1] == "=>" && fields[2] == "not":
			return nil, fmt.Errorf("%s needs %s, which this machine lacks", program, fields[0])
		}
	}
	return libs, sc.Err()
}
