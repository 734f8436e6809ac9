// Command image builds ebb's OCI image without a container engine and
// writes it as an OCI image layout: a single layer with the static ebb
// binary and a non-root user, on an empty base (no base image can be
// pulled here, and ebb needs nothing else; the binary embeds its TLS roots
// from a pinned module, so nothing of the build host goes in). The same inputs
// give the same digest: file times, owners and the config's dates are fixed
// (SOURCE_DATE_EPOCH, default 0) and entries are written in one order.
//
//	go run ./hack/image -binary dist/ebb-linux-amd64 -out dist/oci -ref ghcr.io/ebbdev/ebb:v0.1.0
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the image holds ebb; it is the entrypoint.
const BinaryPath = "usr/local/bin/ebb"

// nonroot is the user the image runs as (distroless's number).
const nonroot = 65532

func main() {
	binary := flag.String("binary", "", "the static ebb binary (linux/amd64)")
	out := flag.String("out", "dist/oci", "OCI image layout directory to write (replaced)")
	ref := flag.String("ref", "ghcr.io/ebbdev/ebb:dev", "image reference: the layout's ref.name annotation")
	flag.Parse()
	digest, err := build(*binary, *out, *ref, sourceDate())
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

// sourceDate is SOURCE_DATE_EPOCH (reproducible-builds.org), else 0.
func sourceDate() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Unix(0, 0).UTC()
}

func build(binary, out, ref string, date time.Time) (string, error) {
	if binary == "" {
		return "", fmt.Errorf("-binary is required")
	}
	files := []file{
		{path: "etc/", mode: 0o755, dir: true},
		{path: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot))},
		{path: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot))},
		{path: "home/", mode: 0o755, dir: true},
		{path: "home/nonroot/", mode: 0o700, dir: true, uid: nonroot},
		// The controller writes its webhook certificates under /tmp.
		{path: "tmp/", mode: 0o1777, dir: true},
		{path: "usr/", mode: 0o755, dir: true},
		{path: "usr/local/", mode: 0o755, dir: true},
		{path: "usr/local/bin/", mode: 0o755, dir: true},
		{path: BinaryPath, mode: 0o755, src: binary},
	}
	layerTar, err := tarFiles(files, date)
	if err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return "", fmt.Errorf("making the layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{CreatedBy: "hack/image: ebb, nonroot user", Created: v1.Time{Time: date}},
	})
	if err != nil {
		return "", fmt.Errorf("adding the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: date}
	cfg.Config.Entrypoint = []string{"/" + BinaryPath}
	cfg.Config.User = fmt.Sprintf("%d:%d", nonroot, nonroot)
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.source":  "https://github.com/ebbdev/ebb",
		"org.opencontainers.image.version": refTag(ref),
		"org.opencontainers.image.title":   "ebb",
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return "", fmt.Errorf("setting the image config: %w", err)
	}
	if err := os.RemoveAll(out); err != nil {
		return "", fmt.Errorf("removing the old layout %s: %w", out, err)
	}
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return "", fmt.Errorf("writing the layout %s: %w", out, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return "", fmt.Errorf("writing the image into %s: %w", out, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return digest.String(), nil
}

// refTag is the tag of an image reference ("dev" if none).
func refTag(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		return ref[i+1:]
	}
	return "dev"
}

// file is one entry of the layer: a directory, inline data, or a file
// copied from src.
type file struct {
	path string
	mode int64
	dir  bool
	uid  int
	data []byte
	src  string
}

// tarFiles writes the entries, in the given order, with fixed times and
// owners.
func tarFiles(files []file, date time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.path, Mode: f.mode, ModTime: date, Uid: f.uid, Gid: f.uid, Format: tar.FormatPAX}
		if f.dir {
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		data := f.data
		if f.src != "" {
			var err error
			if data, err = os.ReadFile(filepath.Clean(f.src)); err != nil {
				return nil, fmt.Errorf("reading %s for %s: %w", f.src, f.path, err)
			}
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
