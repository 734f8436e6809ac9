package dataplane

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/go-logr/logr"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// ebpfObject is the eBPF kernel path's program and maps, built from
// bpf/ebb_lb.c by `make generate` (see that file for what it does).
//
//go:embed bpf/ebb_lb.o
var ebpfObject []byte

// DefaultBPFPinDir is where the eBPF kernel path pins its maps and
// attachments by default.
const DefaultBPFPinDir = "/sys/fs/bpf/ebb"

// ebpfPath is the kernel engine's eBPF path: it loads bpf/ebb_lb.o,
// attaches its programs at tc ingress and egress of the namespace's
// interfaces, and keeps its
// maps as the frontends say (kernel_ebpf_maps.go). The maps and the
// attachments are pinned under the pin directory, so that the kernel
// keeps forwarding while ebb lb restarts, and the next ebb lb takes them
// over.
type ebpfPath struct {
	table      string
	pinBase    string
	interfaces []string
	netns      int
	clock      Clock
	log        logr.Logger

	mu sync.Mutex
	// use guards coll's lifetime for the readers of the flow table
	// (activeFlows, dropFlows, the sweeper), which do not take mu: a pass
	// over a full table takes milliseconds, and must not hold up an
	// admin-state change. coll and links change with both held.
	use  sync.RWMutex
	coll *ebpf.Collection
	// links are the programs' attachments, by interface index.
	links map[int]attachedInterface
	// contents is what the maps hold, as this process last wrote or
	// first read them.
	contents *bpfContents
	// slotState is the slot plan the maps hold (nil installed after a
	// load: the first sync plans afresh).
	slotState
	// idle is each frontend's idle timeout, for the sweeper: replaced
	// by each sync, never changed in place.
	idle atomic.Pointer[map[bpfFrontendKey]time.Duration]
	// stopWorkers stops the sweeper and the interface watcher.
	stopWorkers chan struct{}
	// capacity, if set, replaces the maps' sizes in fit (tests: a full
	// map without writing a million elements).
	capacity map[string]int
	// loaded: load ran since the last sync, which counts as a rebuild.
	loaded bool
}

func newEBPFPath(opts Options) *ebpfPath {
	e := &ebpfPath{table: opts.KernelTable, pinBase: opts.BPFPinDir, interfaces: opts.BPFInterfaces, netns: opts.NetNS, clock: opts.Clock, log: opts.Logger}
	if e.table == "" {
		e.table = DefaultKernelTable
	}
	if e.pinBase == "" {
		e.pinBase = DefaultBPFPinDir
	}
	return e
}

// unsupported: the program parses IPv4 TCP, and forwards what arrives
// from other hosts only.
func (e *ebpfPath) unsupported(f *Frontend) string {
	k := f.key()
	switch {
	case k.protocol != TCP:
		return "the eBPF kernel path forwards TCP only (use the nftables kernel path, ebb lb --kernel-path=nftables, or the proxy engine)"
	case !k.addr.Addr().Is4():
		return "the eBPF kernel path forwards IPv4 only (use the nftables kernel path, ebb lb --kernel-path=nftables, or the proxy engine)"
	}
	return ""
}

// pinDirectory is the directory of this namespace's and table's pins:
// the namespace's inode tells the load balancer hosts of one machine
// apart (the local cluster's, a test's).
func (e *ebpfPath) pinDirectory() (string, error) {
	path := "/proc/self/ns/net"
	if e.netns != 0 {
		path = fmt.Sprintf("/proc/self/fd/%d", e.netns)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("reading the network namespace's inode: %w", err)
	}
	return filepath.Join(e.pinBase, fmt.Sprintf("netns-%d", st.Ino), e.table), nil
}

// mountBPFFS makes sure dir is on a bpffs: it mounts one at
// /sys/fs/bpf if dir is under it and nothing is mounted there yet.
func mountBPFFS(dir string) error {
	const root = "/sys/fs/bpf"
	probe := dir
	for {
		var fs unix.Statfs_t
		if err := unix.Statfs(probe, &fs); err == nil {
			if fs.Type == unix.BPF_FS_MAGIC {
				return nil
			}
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	if dir != root && !strings.HasPrefix(dir, root+"/") {
		return fmt.Errorf("%s is not on a bpffs: mount one there or choose a directory under %s (--bpf-pin-dir)", dir, root)
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting a bpffs at %s (the eBPF kernel path pins its maps there, so that flows survive a restart): %w", root, err)
	}
	return nil
}

// load loads the program and maps, or takes over those pinned, and
// attaches the program to the interfaces. e.mu is held.
func (e *ebpfPath) load() error {
	if e.coll != nil {
		return nil
	}
	dir, err := e.pinDirectory()
	if err != nil {
		return err
	}
	if err := mountBPFFS(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making the pin directory: %w", err)
	}
	coll, err := loadPinned(dir)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Maps pinned by an ebb of another layout: start afresh. The
		// flows they carried end.
		e.log.Info("The pinned eBPF maps are of another layout; replacing them (their flows end)", "dir", dir)
		if err := removePins(dir); err != nil {
			return err
		}
		coll, err = loadPinned(dir)
	}
	if err != nil {
		return err
	}
	links, err := e.attach(dir, e.attachments(coll))
	if err != nil {
		coll.Close()
		return err
	}
	contents, err := readContents(coll)
	if err != nil {
		closeAttached(links)
		coll.Close()
		return err
	}
	e.use.Lock()
	e.coll, e.links, e.contents = coll, links, contents
	e.use.Unlock()
	e.warnIfEphemeralPortsOverlap()
	e.loaded = true
	e.slotState = slotState{}
	e.stopWorkers = make(chan struct{})
	go e.sweepEvery(bpfSweepInterval, e.stopWorkers)
	if len(e.interfaces) == 0 {
		go e.watchInterfaces(dir, e.stopWorkers)
	}
	return nil
}

func loadPinned(dir string) (*ebpf.Collection, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(ebpfObject))
	if err != nil {
		return nil, fmt.Errorf("reading the eBPF object: %w", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinByName
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		return nil, fmt.Errorf("loading the eBPF kernel path: %w", err)
	}
	return coll, nil
}

// removePins unpins everything in dir but the directory.
func removePins(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing the pins: %w", err)
	}
	for _, ent := range entries {
		if err := os.Remove(filepath.Join(dir, ent.Name())); err != nil {
			return fmt.Errorf("unpinning %s: %w", ent.Name(), err)
		}
	}
	return nil
}

// sync writes the maps for frontends: the nftables path's slot plan
// (kernelEngine.sync), element by element, in an order that keeps every
// lookup of a new flow consistent (write). Without prepare, the entries
// prepared for owners' next changes are left as they are, and stale says
// whether a later sync with prepare should bring them up to date.
func (e *ebpfPath) sync(frontends []*frontend, m *metrics, prepare bool) (stale bool, err error) {
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.load(); err != nil {
		m.kernelFailures.Inc()
		return false, err
	}
	kind := "entries"
	if e.loaded {
		// The first sync since the path was loaded (by fit, usually): a
		// rebuild, unless it takes over a predecessor's maps as they
		// are (no element written: below).
		kind = "rebuild"
		e.loaded = false
	}
	owners, err := e.ownerTable(frontends)
	if err != nil {
		m.kernelFailures.Inc()
		return false, err
	}
	ids, err := e.frontendIDs(frontends)
	if err != nil {
		m.kernelFailures.Inc()
		return false, err
	}
	want := make(map[*frontend]installedFrontend, len(frontends))
	for _, f := range frontends {
		set := f.set.Load()
		want[f] = installedFrontend{set: set, family: nftables.TableFamilyIPv4, index: int(ids[f]), elig: eligibilityOf(set)}
	}
	families := map[nftables.TableFamily]ownerTable{nftables.TableFamilyIPv4: owners}
	_, stale, prepared := e.planAll(want, families, prepare)
	contents := e.render(want, owners)
	changed, err := e.write(contents)
	if changed == 0 {
		kind = "owners"
	}
	if err != nil {
		m.kernelFailures.Inc()
		// What the maps hold is unknown now: read it back, and plan
		// afresh.
		if got, rerr := readContents(e.coll); rerr == nil {
			e.contents = got
		}
		e.slotState = slotState{}
		return false, fmt.Errorf("writing the eBPF kernel path's maps: %w", err)
	}
	e.contents = contents
	e.observeMaps(m)
	e.record(want, families, prepared)
	m.kernelSyncs.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	return stale, nil
}

// flipOwner is the eBPF path's fast path for one owner's admin-state
// change (see planFlip): one element of the owners map.
func (e *ebpfPath) flipOwner(frontends []*frontend, owner string, m *metrics) (bool, error) {
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.coll == nil {
		return false, nil
	}
	changed, ok := e.planFlip(frontends, owner)
	if !ok {
		return false, nil
	}
	if state, flips := changed[nftables.TableFamilyIPv4]; flips {
		id := e.owners[nftables.TableFamilyIPv4].ids[owner]
		if err := e.coll.Maps["owners"].Put(id, uint32(state)); err != nil {
			m.kernelFailures.Inc()
			e.slotState = slotState{}
			return false, fmt.Errorf("changing %s in the owners map: %w", owner, err)
		}
		e.contents.owners[id] = uint32(state)
	}
	e.recordFlip(frontends, owner, changed)
	m.kernelSyncs.WithLabelValues("owners").Observe(time.Since(start).Seconds())
	return true, nil
}

// hasState reports whether the namespace's pin directory exists.
func (e *ebpfPath) hasState() (bool, error) {
	dir, err := e.pinDirectory()
	if err != nil {
		return false, err
	}
	switch _, err := os.Stat(dir); {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("looking for the eBPF kernel path's pins: %w", err)
	}
}

// remove detaches the program and unpins everything: new and established
// flows alike are no longer forwarded.
func (e *ebpfPath) remove() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.release()
	dir, err := e.pinDirectory()
	if err != nil {
		return err
	}
	// Detached first: a link whose last pin goes is detached later, by
	// the kernel's deferred release, and meanwhile its program goes on
	// translating new flows (seen: a proxy started after it lost its
	// first connections to the old backends).
	entries, _ := os.ReadDir(dir)
	for _, ent := range entries {
		if _, ok := pinnedInterface(ent.Name()); !ok {
			continue
		}
		if l, err := link.LoadPinnedLink(filepath.Join(dir, ent.Name()), nil); err == nil {
			if err := l.Detach(); err != nil && !errors.Is(err, unix.ENOLINK) {
				e.log.Error(err, "Detaching the eBPF kernel path", "pin", ent.Name())
			}
			_ = l.Close()
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the eBPF kernel path's pins: %w", err)
	}
	// The namespace's directory goes with its last table.
	_ = os.Remove(filepath.Dir(dir))
	return nil
}

// close lets go of the program, maps and attachments; their pins keep
// them in the kernel, forwarding.
func (e *ebpfPath) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.release()
}

// release stops the sweeper and closes what the process holds. e.mu is
// held.
func (e *ebpfPath) release() {
	if e.stopWorkers != nil {
		close(e.stopWorkers)
		e.stopWorkers = nil
	}
	e.use.Lock()
	defer e.use.Unlock()
	closeAttached(e.links)
	if e.coll != nil {
		e.coll.Close()
	}
	e.coll, e.links, e.contents, e.slotState = nil, nil, nil, slotState{}
}

// addr4 is an IPv4 address as the program keeps it (the path serves
// IPv4 frontends and backends only: unsupported).
func addr4(a netip.Addr) [4]byte { return a.Unmap().As4() }

// bigEndianPort is a port as the packet carries it.
func bigEndianPort(p uint16) [2]byte { return [2]byte{byte(p >> 8), byte(p)} }

func portOf(p [2]byte) uint16 { return uint16(p[0])<<8 | uint16(p[1]) }
