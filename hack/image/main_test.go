package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The same inputs give the same digest, and the image runs ebb as the
// nonroot user with the binary where the entrypoint looks for it, and
// nothing of the build host (the binary embeds its TLS roots).
func TestImageIsReproducibleAndHoldsEbb(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ebb")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	date := time.Unix(1700000000, 0).UTC()
	first, err := build(bin, filepath.Join(dir, "a"), "ghcr.io/ebbdev/ebb:v1", date)
	if err != nil {
		t.Fatal(err)
	}
	second, err := build(bin, filepath.Join(dir, "b"), "ghcr.io/ebbdev/ebb:v1", date)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatalf("two builds of the same inputs: %s and %s", first, second)
	}
	if other, _ := build(bin, filepath.Join(dir, "c"), "ghcr.io/ebbdev/ebb:v1", date.Add(time.Second)); other == first {
		t.Fatal("a different SOURCE_DATE_EPOCH gave the same digest: dates are not in the image")
	}

	p, err := layout.FromPath(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "ghcr.io/ebbdev/ebb:v1" {
		t.Fatalf("index: %+v", manifest.Manifests)
	}
	img, err := p.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Config.Entrypoint; len(got) != 1 || got[0] != "/usr/local/bin/ebb" {
		t.Errorf("entrypoint %v", got)
	}
	if cfg.Config.User != "65532:65532" || cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("user %q, platform %s/%s", cfg.Config.User, cfg.OS, cfg.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	found := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		found[hdr.Name] = hdr
	}
	for name, mode := range map[string]int64{"usr/local/bin/ebb": 0o755, "tmp/": 0o1777} {
		hdr, ok := found[name]
		if !ok {
			t.Errorf("the layer has no %s", name)
			continue
		}
		if hdr.Mode != mode || !hdr.ModTime.Equal(date) {
			t.Errorf("%s: mode %o time %s, want %o and %s", name, hdr.Mode, hdr.ModTime, mode, date)
		}
	}
	for name := range found {
		if strings.HasPrefix(name, "etc/ssl") {
			t.Errorf("the layer carries %s from the build host", name)
		}
	}
	for _, env := range cfg.Config.Env {
		if strings.HasPrefix(env, "SSL_CERT") {
			t.Errorf("the image sets %s but carries no CA bundle", env)
		}
	}
}
