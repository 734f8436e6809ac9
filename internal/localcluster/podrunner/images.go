package podrunner

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// refNameAnnotation names an image in an OCI layout's index.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Images is the node's image store: OCI image layouts (what `make image`
// writes) standing in for a registry. A pod's image is found by digest
// (`name@sha256:...`, as dist/install.yaml pins it) or by the reference
// name the layout gives it. Each image's filesystem is unpacked once.
type Images struct {
	layouts []string
	dir     string

	mu       sync.Mutex
	unpacked map[v1.Hash]*Image
	// indexes are the layouts' indexes, read once: every pod event asks
	// whether its image is here.
	indexes map[string]v1.ImageIndex
}

// Image is an unpacked image: its root filesystem and its configuration.
type Image struct {
	Digest v1.Hash
	// Root is the unpacked filesystem.
	Root   string
	Config v1.Config
}

// NewImages serves the images of the OCI layouts, unpacking them under dir.
func NewImages(dir string, layouts ...string) *Images {
	return &Images{layouts: layouts, dir: dir, unpacked: map[v1.Hash]*Image{}, indexes: map[string]v1.ImageIndex{}}
}

// Resolve returns the image ref names, unpacked; ok is false when no
// layout has it (the pod is then simulated, not run).
func (s *Images) Resolve(ref string) (img *Image, ok bool, err error) {
	for _, l := range s.layouts {
		found, digest, err := s.findImage(l, ref)
		if err != nil {
			return nil, false, err
		}
		if found == nil {
			continue
		}
		img, err := s.unpack(found, digest)
		return img, err == nil, err
	}
	return nil, false, nil
}

// Has reports whether a layout holds ref, without unpacking it.
func (s *Images) Has(ref string) bool {
	for _, l := range s.layouts {
		if found, _, err := s.findImage(l, ref); err == nil && found != nil {
			return true
		}
	}
	return false
}

// findImage looks ref up in the layout at path.
func (s *Images) findImage(path, ref string) (v1.Image, v1.Hash, error) {
	s.mu.Lock()
	idx, ok := s.indexes[path]
	s.mu.Unlock()
	if !ok {
		var err error
		if idx, err = layout.ImageIndexFromPath(path); err != nil {
			return nil, v1.Hash{}, fmt.Errorf("reading the image layout %s: %w", path, err)
		}
		s.mu.Lock()
		s.indexes[path] = idx
		s.mu.Unlock()
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading the index of %s: %w", path, err)
	}
	_, digest, pinned := strings.Cut(ref, "@")
	for _, m := range manifest.Manifests {
		if (pinned && m.Digest.String() == digest) || (!pinned && m.Annotations[refNameAnnotation] == ref) {
			img, err := idx.Image(m.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("reading image %s from %s: %w", m.Digest, path, err)
			}
			return img, m.Digest, nil
		}
	}
	return nil, v1.Hash{}, nil
}

func (s *Images) unpack(img v1.Image, digest v1.Hash) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.unpacked[digest]; ok {
		return u, nil
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the configuration of image %s: %w", digest, err)
	}
	root := filepath.Join(s.dir, digest.Hex, "rootfs")
	if err := os.RemoveAll(filepath.Dir(root)); err != nil {
		return nil, fmt.Errorf("clearing %s: %w", root, err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := untar(rc, root); err != nil {
		return nil, fmt.Errorf("unpacking image %s: %w", digest, err)
	}
	u := &Image{Digest: digest, Root: root, Config: cfg.Config}
	s.unpacked[digest] = u
	return u, nil
}

// untar writes a flattened image filesystem under root. Owners are not
// kept: the cluster's user namespace maps only root.
func untar(r io.Reader, root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean("/" + hdr.Name)
		target := filepath.Join(root, name)
		mode := os.FileMode(hdr.Mode).Perm() | os.FileMode(hdr.Mode)&(os.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(target, mode|dirModeBits(hdr.Mode)); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil { //nolint:gosec // our own image, size bounded by the layout
				_ = f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		default:
			// Devices, FIFOs and hard links: ebb's image has none.
			return fmt.Errorf("%s: unsupported entry type %q", hdr.Name, hdr.Typeflag)
		}
	}
}

// dirModeBits keeps a directory's sticky bit (/tmp is 1777).
func dirModeBits(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}
