// Package nodeimage builds the images that the local cluster's real nodes
// run, without a container engine, and packs every image a node needs as an
// OCI archive that `ctr images import` takes: the pod sandbox (pause), the
// app image (agnhost, Kubernetes' own test server, under the name
// Kubernetes' e2e tests use) and the images of OCI layouts (ebb's, from
// `make image`). Layers are uncompressed: the archives stay on this machine,
// and gzip would cost seconds of a core at every cluster start.
package nodeimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The names pods use. They are the upstream images' names, so that
// manifests and Kubernetes' own e2e tests written for a real registry find
// them on the nodes (imagePullPolicy IfNotPresent); the images themselves
// are built here from source.
const (
	// PauseRef is containerd's pinned sandbox image.
	PauseRef = "registry.k8s.io/pause:3.10.2"
	// AgnhostRef is the app image: agnhost with busybox's shell and tools.
	AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	// CoreDNSRef is the cluster DNS image, under the name and version
	// kubeadm 1.36 deploys.
	CoreDNSRef = "registry.k8s.io/coredns/coredns:v1.14.2"
)

// refNameAnnotation names an image in an OCI layout's index.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Archive is an OCI image layout packed as a tar file, and the repository
// (the reference without tag or digest) that `ctr images import
// --base-name` needs to name its images and their digest references.
type Archive struct {
	Path string
	// Repository is the images' repository, e.g. "ghcr.io/ebbdev/ebb".
	Repository string
	// Refs are the images' names in the archive.
	Refs []string
	// Digests are the digests of their manifests, in the same order: a
	// pod may name an image by repository@digest (dist/install.yaml does).
	Digests []string
}

// Busybox is where Debian's busybox-static package puts its binary.
const Busybox = "/bin/busybox"

// Pause builds the sandbox image from the pause binary in binDir.
func Pause(binDir, dir string) (Archive, error) {
	files := []file{
		{path: "pause", mode: 0o755, src: filepath.Join(binDir, "pause")},
	}
	cfg := v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535", WorkingDir: "/"}
	return write(PauseRef, files, cfg, dir, "pause")
}

// CoreDNS builds the cluster DNS image from a static coredns binary.
func CoreDNS(binary, dir string) (Archive, error) {
	if err := checkStatic(binary); err != nil {
		return Archive{}, err
	}
	files := []file{
		{path: "coredns", mode: 0o755, src: binary},
		{path: "etc/", dir: true, mode: 0o755},
		{path: "etc/coredns/", dir: true, mode: 0o755},
	}
	cfg := v1.Config{Entrypoint: []string{"/coredns"}, WorkingDir: "/"}
	return write(CoreDNSRef, files, cfg, dir, "coredns")
}

// Agnhost builds the app image from the agnhost binary in binDir and the
// static busybox at busybox (the tools for `kubectl exec`), plus the
// AppTools this machine has, as upstream's is agnhost on Alpine: entrypoint
// /agnhost, command pause, running as root, with the user and group
// upstream's e2e tests expect to find in the image.
func Agnhost(binDir, busybox, dir string) (Archive, error) {
	if err := checkStatic(busybox); err != nil {
		return Archive{}, err
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return Archive{}, fmt.Errorf("listing busybox's applets (%s; Debian package busybox-static): %w", busybox, err)
	}
	files := []file{
		{path: "agnhost", mode: 0o755, src: filepath.Join(binDir, "agnhost")},
		// Some of upstream's entrypoint tests run the image as agnhost-2.
		{path: "agnhost-2", link: "agnhost"},
		{path: "bin/", dir: true, mode: 0o755},
		{path: "bin/busybox", mode: 0o755, src: busybox},
		{path: "etc/", dir: true, mode: 0o755},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")},
		{path: "root/", dir: true, mode: 0o700},
		{path: "tmp/", dir: true, mode: 0o1777},
		// netexec's uploads go here.
		{path: "uploads/", dir: true, mode: 0o755},
	}
	have := map[string]bool{}
	for _, f := range files {
		if f.dir {
			have[f.path] = true
		}
	}
	tools, present, err := hostToolFiles(AppTools, have)
	if err != nil {
		return Archive{}, fmt.Errorf("adding the host tools to the agnhost image: %w", err)
	}
	files = append(files, tools...)
	taken := map[string]bool{}
	for _, p := range present {
		taken[p] = true
	}
	names := strings.Fields(string(applets))
	sort.Strings(names)
	for _, a := range names {
		if a == "busybox" || strings.Contains(a, "/") || taken["bin/"+a] {
			continue
		}
		files = append(files, file{path: "bin/" + a, link: "busybox"})
	}
	cfg := v1.Config{
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	return write(AgnhostRef, files, cfg, dir, "agnhost")
}

// FromLayout packs an OCI image layout (dist/oci) as an archive. Its images
// keep their manifests, so a pod that names one by digest (as
// dist/install.yaml does) finds it.
func FromLayout(layoutDir, dir string) (Archive, error) {
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		return Archive{}, fmt.Errorf("reading the image layout %s: %w", layoutDir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return Archive{}, fmt.Errorf("reading the index of %s: %w", layoutDir, err)
	}
	a := Archive{Path: filepath.Join(dir, filepath.Base(layoutDir)+".tar")}
	for _, d := range m.Manifests {
		ref := d.Annotations[refNameAnnotation]
		if ref == "" {
			continue
		}
		repo, err := repository(ref)
		if err != nil {
			return Archive{}, fmt.Errorf("image %s of %s: %w", ref, layoutDir, err)
		}
		if a.Repository != "" && a.Repository != repo {
			return Archive{}, fmt.Errorf("the layout %s holds images of two repositories (%s, %s): ctr names one archive's images after one", layoutDir, a.Repository, repo)
		}
		a.Repository = repo
		a.Refs = append(a.Refs, ref)
		a.Digests = append(a.Digests, d.Digest.String())
	}
	if len(a.Refs) == 0 {
		return Archive{}, fmt.Errorf("the layout %s names no image (annotation %s)", layoutDir, refNameAnnotation)
	}
	if err := tarDir(layoutDir, a.Path); err != nil {
		return Archive{}, err
	}
	return a, nil
}

// write makes a one-layer image of files with cfg, writes it as a layout
// under dir/name and packs it.
func write(ref string, files []file, cfg v1.Config, dir, name string) (Archive, error) {
	repo, err := repository(ref)
	if err != nil {
		return Archive{}, err
	}
	epoch := time.Unix(0, 0).UTC()
	data, err := tarFiles(files, epoch)
	if err != nil {
		return Archive{}, fmt.Errorf("making the layer of %s: %w", ref, err)
	}
	img, err := mutate.Append(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1),
		mutate.Addendum{Layer: static.NewLayer(data, types.OCIUncompressedLayer), History: v1.History{CreatedBy: "ebb's local cluster (internal/localcluster/nodeimage)", Created: v1.Time{Time: epoch}}})
	if err != nil {
		return Archive{}, fmt.Errorf("making %s: %w", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Archive{}, fmt.Errorf("reading the configuration of %s: %w", ref, err)
	}
	cf = cf.DeepCopy()
	// The binaries are this machine's own builds.
	cf.Architecture, cf.OS, cf.Created, cf.Config = runtime.GOARCH, "linux", v1.Time{Time: epoch}, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Archive{}, fmt.Errorf("configuring %s: %w", ref, err)
	}
	layoutDir := filepath.Join(dir, name)
	if err := os.RemoveAll(layoutDir); err != nil {
		return Archive{}, fmt.Errorf("removing the old layout %s: %w", layoutDir, err)
	}
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return Archive{}, fmt.Errorf("writing the layout of %s: %w", ref, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: ref})); err != nil {
		return Archive{}, fmt.Errorf("writing %s into %s: %w", ref, layoutDir, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return Archive{}, fmt.Errorf("computing the digest of %s: %w", ref, err)
	}
	a := Archive{Path: layoutDir + ".tar", Repository: repo, Refs: []string{ref}, Digests: []string{digest.String()}}
	if err := tarDir(layoutDir, a.Path); err != nil {
		return Archive{}, err
	}
	return a, os.RemoveAll(layoutDir)
}

// checkStatic refuses a dynamically linked program: the image has no
// libraries.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s (Debian package busybox-static): %w", path, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically and would not run in an image without libraries: install Debian's busybox-static", path)
		}
	}
	return nil
}

// repository is ref without its tag or digest.
func repository(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("parsing the image reference %q: %w", ref, err)
	}
	return r.Context().Name(), nil
}

// file is one entry of a layer: a directory, a symbolic link, inline data
// or a file copied from src.
type file struct {
	path string
	mode int64
	dir  bool
	link string
	data []byte
	src  string
}

// tarFiles writes the entries in the given order, owned by root, with fixed
// times, so that the same inputs give the same layer.
func tarFiles(files []file, date time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.path, Mode: f.mode, ModTime: date, Format: tar.FormatPAX}
		data := f.data
		switch {
		case f.dir:
			hdr.Typeflag = tar.TypeDir
		case f.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.link, 0o777
		default:
			if f.src != "" {
				var err error
				if data, err = os.ReadFile(f.src); err != nil {
					return nil, fmt.Errorf("reading %s for %s: %w", f.src, f.path, err)
				}
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		}
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

// tarDir packs the directory src (an OCI layout) into the tar file dst,
// with the paths relative to src.
func tarDir(src, dst string) (err error) {
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("writing %s: %w", dst, cerr)
		}
	}()
	tw := tar.NewWriter(out)
	err = filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == src {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("packing %s into %s: %w", src, dst, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}
