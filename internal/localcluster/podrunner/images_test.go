package podrunner

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// writeLayout writes an OCI layout holding one image with a program and a
// sticky /tmp, named ref.
func writeLayout(t *testing.T, ref string) (string, v1.Hash) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "usr/local/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin/prog", Typeflag: tar.TypeReg, Mode: 0o755, Size: 5},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("hello"))
		}
	}
	_ = tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/usr/local/bin/prog"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: ref})); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return dir, digest
}

func TestImagesResolveByDigestOrName(t *testing.T) {
	dir, digest := writeLayout(t, "example.com/prog:v1")
	images := NewImages(t.TempDir(), dir)
	for _, ref := range []string{"example.com/prog@" + digest.String(), "other.registry/renamed@" + digest.String(), "example.com/prog:v1"} {
		img, ok, err := images.Resolve(ref)
		if err != nil || !ok {
			t.Fatalf("Resolve(%s) = %v, %v", ref, ok, err)
		}
		data, err := os.ReadFile(filepath.Join(img.Root, "usr/local/bin/prog"))
		if err != nil || string(data) != "hello" {
			t.Errorf("%s: program %q, %v", ref, data, err)
		}
		st, err := os.Stat(filepath.Join(img.Root, "tmp"))
		if err != nil || st.Mode()&os.ModeSticky == 0 {
			t.Errorf("%s: /tmp lost its sticky bit: %v %v", ref, st.Mode(), err)
		}
		if img.Config.Entrypoint[0] != "/usr/local/bin/prog" {
			t.Errorf("%s: entrypoint %v", ref, img.Config.Entrypoint)
		}
	}
	for _, ref := range []string{"example.com/prog:v2", "example.com/prog@sha256:0000000000000000000000000000000000000000000000000000000000000000", "busybox"} {
		if images.Has(ref) {
			t.Errorf("Has(%s): true for an image the layout does not hold", ref)
		}
	}
}
