package lb

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/handoff"
	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// --handoff-socket=auto is one path per network namespace, in a directory
// only its owner may enter: the two processes of a host meet there, two
// namespaces on one machine (the local cluster's nodes) never do.
func TestAutoHandoffSocketIsPrivateAndPerNetworkNamespace(t *testing.T) {
	dir := t.TempDir()
	here, err := handoffSocketPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := handoffSocketPath(dir)
	h, err := network.NewHost("ho-sock")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var there string
	if err := h.Do(func() (err error) { there, err = handoffSocketPath(dir); return err }); err != nil {
		t.Fatal(err)
	}
	if here != again || here == there || !strings.HasPrefix(here, dir+"/net-") {
		t.Fatalf("paths %q, %q (again) and %q (another namespace)", here, again, there)
	}
	if err := os.MkdirAll(filepath.Dir(here), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := privateDir(filepath.Dir(here)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Dir(here)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the auto socket's directory: %v, %v", fi.Mode(), err)
	}
	// A path given by hand is used as it is: its directory (/tmp, say) is
	// not made private.
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, os.ModePerm|os.ModeSticky); err != nil { // past the umask
		t.Fatal(err)
	}
	o := &Options{HandoffSocket: filepath.Join(shared, "handoff.sock")}
	o.resolveHandoffSocket(testr.New(t))
	if fi, err := os.Stat(shared); err != nil || fi.Mode()&(os.ModePerm|os.ModeSticky) != os.ModePerm|os.ModeSticky || o.HandoffSocket == "" {
		t.Fatalf("a given socket's directory became %v (%v); socket %q", fi.Mode(), err, o.HandoffSocket)
	}
}

// A successor of the path socket takes the sockets of a predecessor of an
// earlier version, which offers at the legacy abstract address, when
// nobody offers at the path: the upgrade from such a version hands over.
func TestASuccessorTakesFromTheLegacySocket(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	legacy := fmt.Sprintf("@ebb-lb-legacy-test-%d", os.Getpid())
	offer, err := handoff.Listen(testr.New(t), legacy)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = offer.Serve(ctx, func() ([]*os.File, error) {
			f, err := ln.File()
			return []*os.File{f}, err
		})
	}()
	for _, c := range []struct {
		legacy string
		want   int
	}{{"", 0}, {legacy, 1}} {
		o := &Options{HandoffSocket: filepath.Join(t.TempDir(), "s", "handoff.sock"), LegacyHandoffSocket: c.legacy}
		o.resolveHandoffSocket(testr.New(t))
		taken := o.takeSockets(ctx, testr.New(t))
		got := 0
		if taken != nil {
			got = len(taken.Files)
			for _, f := range taken.Files {
				f.Close()
			}
			taken.Abort()
		}
		if got != c.want {
			t.Errorf("legacy socket %q: took %d sockets, want %d", c.legacy, got, c.want)
		}
	}
}

// A process of the host's network namespace that does not have the
// socket's directory (a hostNetwork pod without ebb lb's hostPath volume:
// its own mount namespace) cannot take ebb lb's sockets at the path
// socket; at the abstract socket earlier versions used, it could.
func TestAProcessWithoutTheDirectoryCannotTake(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	files := func() ([]*os.File, error) {
		f, err := ln.File()
		return []*os.File{f}, err
	}
	path := filepath.Join(t.TempDir(), "net-x", "handoff.sock")
	o := &Options{HandoffSocket: path}
	o.resolveHandoffSocket(testr.New(t))
	abstractAddr := fmt.Sprintf("@ebb-lb-hostile-test-%d", os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, addr := range []string{path, abstractAddr} {
		offer, err := handoff.Listen(testr.New(t), addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = offer.Serve(ctx, files) }()
	}
	// The hostile process: this network namespace, a mount namespace of
	// its own in which the socket's directory is not there.
	took := func(addr string) (int, error) {
		type result struct {
			n   int
			err error
		}
		out := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				out <- result{err: err}
				return
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				out <- result{err: err}
				return
			}
			if err := unix.Mount("tmpfs", filepath.Dir(path), "tmpfs", 0, ""); err != nil {
				out <- result{err: err}
				return
			}
			taken, err := handoff.Take(ctx, addr)
			if taken == nil {
				out <- result{err: err}
				return
			}
			closeAllFiles(taken.Files)
			taken.Abort()
			out <- result{n: len(taken.Files)}
		}()
		r := <-out
		return r.n, r.err
	}
	if n, err := took(path); n != 0 {
		t.Errorf("a process without the directory took %d sockets at the path socket (%v)", n, err)
	}
	if n, err := took(abstractAddr); n != 1 {
		t.Errorf("at the abstract socket it took %d sockets (%v): the test no longer shows the hole it closes", n, err)
	}
}

func closeAllFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
