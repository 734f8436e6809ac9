package nodeimage

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

func TestPauseArchiveNamesTheImageAndItsManifest(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "pause"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := Pause(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if a.Repository != "registry.k8s.io/pause" || len(a.Refs) != 1 || a.Refs[0] != PauseRef || len(a.Digests) != 1 {
		t.Fatalf("archive %+v, want %s with its digest", a, PauseRef)
	}
	entries := archiveEntries(t, a.Path)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(entries["index.json"], &index); err != nil {
		t.Fatalf("the archive's index.json: %v", err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != a.Digests[0] || index.Manifests[0].Annotations[refNameAnnotation] != PauseRef {
		t.Errorf("index %+v, want one manifest %s named %s", index.Manifests, a.Digests[0], PauseRef)
	}
	if _, ok := entries["oci-layout"]; !ok {
		t.Error("the archive is not an OCI layout (no oci-layout)")
	}
	// Same inputs, same image.
	again, err := Pause(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if again.Digests[0] != a.Digests[0] {
		t.Errorf("two builds of the same pause gave %s and %s", a.Digests[0], again.Digests[0])
	}
}

func TestFromLayoutKeepsTheLayoutsImages(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "pause"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A layout as `make image` writes one: build it with Pause's code path,
	// unpacked.
	dir := t.TempDir()
	a, err := Pause(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(t.TempDir(), "oci")
	if err := os.MkdirAll(layoutDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range archiveEntries(t, a.Path) {
		path := filepath.Join(layoutDir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := layout.ImageIndexFromPath(layoutDir); err != nil {
		t.Fatal(err)
	}
	got, err := FromLayout(layoutDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got.Repository != a.Repository || len(got.Refs) != 1 || got.Refs[0] != PauseRef || got.Digests[0] != a.Digests[0] {
		t.Errorf("FromLayout = %+v, want %+v", got, a)
	}
	if _, err := FromLayout(t.TempDir(), t.TempDir()); err == nil {
		t.Error("FromLayout of a directory that is no layout: nil error")
	}
}

func TestAgnhostRefusesADynamicBusybox(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "agnhost"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	// /bin/sh is linked dynamically on Debian.
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Agnhost(bin, sh, t.TempDir()); err == nil {
		t.Errorf("Agnhost with %s (dynamic) as busybox: nil error, want one naming busybox-static", sh)
	}
}

func archiveEntries(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	r := tar.NewReader(f)
	for {
		hdr, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		out[hdr.Name] = data
	}
}
