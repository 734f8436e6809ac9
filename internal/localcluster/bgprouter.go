package localcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the BGP set-up: the router (FRR) has RouterASN and accepts
// sessions from any host on the node network with LBASN (BGP dynamic
// neighbours), so a test runs ebb lb with --bgp-asn LBASN --bgp-peer
// RouterIP:RouterASN on any host, or creates a BGPPeer saying the same.
// The sessions are IPv4 and carry both families (MP-BGP): IPv6 routes come
// with the LB host's IPv6 address as their next hop.
const (
	RouterASN = 64500
	LBASN     = 64512
)

// frrDir is where Debian's frr package installs its daemons.
const frrDir = "/usr/lib/frr"

// BGPRouter is FRR (zebra and bgpd) running on the router host: it learns
// load-balancer addresses by BGP and installs them, several next hops each
// (ECMP), into the router's kernel.
type BGPRouter struct {
	dir   string
	procs []*process
}

// BGPRouterOptions configure the router's sessions with the LB hosts.
type BGPRouterOptions struct {
	// HoldTime of the sessions (FRR accepts 3 s and more).
	HoldTime time.Duration
	// Password, when set, is the sessions' TCP MD5 password: the LB hosts
	// must use it too.
	Password string
}

// StartBGPRouter starts FRR on the router host and waits until it answers.
func (c *Cluster) StartBGPRouter(ctx context.Context, opts BGPRouterOptions) (*BGPRouter, error) {
	if !InNamespace() {
		return nil, fmt.Errorf("FRR runs only inside the cluster's private namespace")
	}
	dir, err := os.MkdirTemp(c.opts.Dir, "frr-")
	if err != nil {
		return nil, fmt.Errorf("making FRR's directory: %w", err)
	}
	if err := allowRootVTY(dir); err != nil {
		return nil, err
	}
	// Hash flows across ECMP next hops by their ports too, as data-centre
	// routers do: one client's connections then spread over the LB hosts.
	for _, family := range []string{"ipv4", "ipv6"} {
		if err := c.Router.SetSysctl("net/"+family+"/fib_multipath_hash_policy", "1"); err != nil {
			return nil, err
		}
	}
	secs := int(opts.HoldTime / time.Second)
	password := ""
	if opts.Password != "" {
		password = fmt.Sprintf(" neighbor ebb password %s\n", opts.Password)
	}
	conf := fmt.Sprintf(`frr defaults datacenter
hostname router
router bgp %d
 bgp router-id %s
 no bgp ebgp-requires-policy
 bgp bestpath as-path multipath-relax
 neighbor ebb peer-group
 neighbor ebb remote-as %d
 neighbor ebb timers %d %d
%s bgp listen range %s peer-group ebb
 address-family ipv4 unicast
  maximum-paths 16
 exit-address-family
 address-family ipv6 unicast
  neighbor ebb activate
  maximum-paths 16
 exit-address-family
`, RouterASN, RouterIP, LBASN, max(secs/3, 1), secs, password, NodeCIDR)
	for name, data := range map[string]string{"bgpd.conf": conf, "zebra.conf": "hostname router\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return nil, fmt.Errorf("writing FRR's %s: %w", name, err)
		}
	}
	r := &BGPRouter{dir: dir}
	common := func(daemon string) []string {
		return []string{"-u", "root", "-g", "root", "-P", "0", "--log", "stdout",
			"-f", filepath.Join(dir, daemon+".conf"), "-i", filepath.Join(dir, daemon+".pid"),
			"-z", filepath.Join(dir, "zserv.api"), "--vty_socket", dir}
	}
	logs := filepath.Join(c.opts.Dir, "logs")
	zebra, err := startProcessOn(c.Router, "frr-zebra", filepath.Join(frrDir, "zebra"), common("zebra"), logs)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, zebra)
	bgpd, err := startProcessOn(c.Router, "frr-bgpd", filepath.Join(frrDir, "bgpd"), append(common("bgpd"), "-p", "179"), logs)
	if err != nil {
		r.Stop()
		return nil, err
	}
	r.procs = append(r.procs, bgpd)
	for {
		if _, err := r.vtysh(ctx, "show bgp summary json"); err == nil {
			return r, nil
		}
		for _, p := range r.procs {
			if done, err := p.exited(); done {
				r.Stop()
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			r.Stop()
			return nil, fmt.Errorf("waiting for FRR to answer (logs in %s): %w", logs, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// allowRootVTY lets FRR's daemons run as root inside the cluster's user
// namespace, where only root is mapped: FRR requires its user to be in the
// compiled-in vty group (frrvty), so the cluster's private mount namespace
// gets an /etc/group in which frrvty is root's group.
func allowRootVTY(dir string) error {
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		return fmt.Errorf("reading /etc/group: %w", err)
	}
	vty := regexp.MustCompile(`(?m)^frrvty:.*$`)
	if !vty.Match(data) {
		return fmt.Errorf("/etc/group has no frrvty group: is Debian's frr package installed (make tools)?")
	}
	path := filepath.Join(dir, "group")
	if err := os.WriteFile(path, vty.ReplaceAll(data, []byte("frrvty:x:0:root")), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := unix.Mount(path, "/etc/group", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on /etc/group in the cluster's mount namespace: %w", path, err)
	}
	return nil
}

// vtysh runs one FRR command and returns its output.
func (r *BGPRouter) vtysh(ctx context.Context, command string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "vtysh", "--vty_socket", r.dir, "-c", command)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("vtysh -c %q: %w: %s", command, err, stderr.String())
	}
	return out, nil
}

// Routes returns the BGP routes of both families FRR installed in the
// router's kernel: each prefix with its next hops, sorted.
func (r *BGPRouter) Routes(ctx context.Context) (map[netip.Prefix][]netip.Addr, error) {
	got := map[netip.Prefix][]netip.Addr{}
	for _, command := range []string{"show ip route bgp json", "show ipv6 route bgp json"} {
		out, err := r.vtysh(ctx, command)
		if err != nil {
			return nil, err
		}
		if err := installedRoutes(out, got); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// RouteDetail is FRR's own account of prefix (`show ip route PREFIX`,
// every entry with its flags: selected, queued, installed, and each next
// hop's state), for a test to say why a route it watches lost a next
// hop.
func (r *BGPRouter) RouteDetail(ctx context.Context, prefix netip.Prefix) string {
	family := "ip"
	if prefix.Addr().Is6() {
		family = "ipv6"
	}
	out, err := r.vtysh(ctx, fmt.Sprintf("show %s route %s", family, prefix))
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// BGPPath is one path FRR holds for a prefix (`show bgp`): its next hop
// and the attributes it came with.
type BGPPath struct {
	NextHop netip.Addr
	// Communities as FRR writes them ("64512:100", "no-export").
	Communities []string
	// LargeCommunities as FRR writes them ("4200000000:1:2").
	LargeCommunities []string
	// LocalPreference, when the path carries one.
	LocalPreference *uint32
}

// Paths returns the BGP paths FRR holds for prefix, from every peer.
func (r *BGPRouter) Paths(ctx context.Context, prefix netip.Prefix) ([]BGPPath, error) {
	family := "ipv4"
	if prefix.Addr().Is6() {
		family = "ipv6"
	}
	out, err := r.vtysh(ctx, fmt.Sprintf("show bgp %s unicast %s json", family, prefix))
	if err != nil {
		return nil, err
	}
	return parseBGPPaths(out)
}

// parseBGPPaths reads FRR's JSON of one prefix's paths.
func parseBGPPaths(out []byte) ([]BGPPath, error) {
	var detail struct {
		Paths []struct {
			LocPrf    *uint32 `json:"locPrf"`
			Community *struct {
				String string `json:"string"`
			} `json:"community"`
			LargeCommunity *struct {
				String string `json:"string"`
			} `json:"largeCommunity"`
			Nexthops []struct {
				IP string `json:"ip"`
			} `json:"nexthops"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(out, &detail); err != nil {
		return nil, fmt.Errorf("decoding FRR's paths %q: %w", out, err)
	}
	var paths []BGPPath
	for _, p := range detail.Paths {
		path := BGPPath{LocalPreference: p.LocPrf}
		if len(p.Nexthops) > 0 {
			path.NextHop, _ = netip.ParseAddr(p.Nexthops[0].IP)
		}
		if p.Community != nil {
			path.Communities = strings.Fields(p.Community.String)
		}
		if p.LargeCommunity != nil {
			path.LargeCommunities = strings.Fields(p.LargeCommunity.String)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// GracefulRestart is what a neighbour's last OPEN said of graceful
// restart (RFC 4724), as FRR read it.
type GracefulRestart struct {
	// Established: the session is up (FRR forgets the bits when it goes
	// down).
	Established bool
	// Restarted is the Restart State bit: the speaker restarted.
	Restarted bool
	// ForwardingKept is each negotiated family's Forwarding State bit
	// (the speaker kept forwarding while it restarted), by FRR's name of
	// the family ("ipv4Unicast", "ipv6Unicast").
	ForwardingKept map[string]bool
}

// GracefulRestartOf returns what neighbor's last OPEN said of graceful
// restart.
func (r *BGPRouter) GracefulRestartOf(ctx context.Context, neighbor netip.Addr) (GracefulRestart, error) {
	out, err := r.vtysh(ctx, fmt.Sprintf("show bgp neighbors %s json", neighbor))
	if err != nil {
		return GracefulRestart{}, err
	}
	return parseGracefulRestart(out, neighbor)
}

// parseGracefulRestart reads the graceful restart part of FRR's JSON of
// one neighbour.
func parseGracefulRestart(out []byte, neighbor netip.Addr) (GracefulRestart, error) {
	var neighbors map[string]struct {
		State string                     `json:"bgpState"`
		Info  map[string]json.RawMessage `json:"gracefulRestartInfo"`
	}
	if err := json.Unmarshal(out, &neighbors); err != nil {
		return GracefulRestart{}, fmt.Errorf("decoding FRR's neighbour %s %q: %w", neighbor, out, err)
	}
	n, ok := neighbors[neighbor.String()]
	if !ok || n.Info == nil {
		return GracefulRestart{}, fmt.Errorf("FRR has no graceful restart state of neighbour %s: %s", neighbor, out)
	}
	gr := GracefulRestart{Established: n.State == "Established", ForwardingKept: map[string]bool{}}
	if err := json.Unmarshal(n.Info["rBit"], &gr.Restarted); err != nil {
		return GracefulRestart{}, fmt.Errorf("FRR's rBit of neighbour %s: %w", neighbor, err)
	}
	for _, family := range []string{"ipv4Unicast", "ipv6Unicast"} {
		raw, ok := n.Info[family]
		if !ok {
			continue
		}
		var af struct {
			FBit bool `json:"fBit"`
		}
		if err := json.Unmarshal(raw, &af); err != nil {
			return GracefulRestart{}, fmt.Errorf("FRR's %s of neighbour %s: %w", family, neighbor, err)
		}
		gr.ForwardingKept[family] = af.FBit
	}
	return gr, nil
}

// Configure changes FRR's running configuration: each line as typed
// after `configure terminal` (e.g. "router bgp 64500", then a line of
// that section).
func (r *BGPRouter) Configure(ctx context.Context, lines ...string) error {
	args := []string{"--vty_socket", r.dir, "-c", "configure terminal"}
	for _, l := range lines {
		args = append(args, "-c", l)
	}
	cmd := exec.CommandContext(ctx, "vtysh", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("configuring FRR with %q: %w: %s", lines, err, out)
	}
	// vtysh exits 0 on some refused lines; FRR says "% ..." then.
	if bytes.Contains(out, []byte("% ")) {
		return fmt.Errorf("configuring FRR with %q: refused: %s", lines, out)
	}
	return nil
}

// installedRoutes adds the installed routes and next hops of FRR's JSON
// route table out to got.
func installedRoutes(out []byte, got map[netip.Prefix][]netip.Addr) error {
	var routes map[string][]struct {
		Installed bool `json:"installed"`
		Nexthops  []struct {
			IP     string `json:"ip"`
			Active bool   `json:"active"`
			FIB    bool   `json:"fib"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return fmt.Errorf("decoding FRR's routes %q: %w", out, err)
	}
	for prefix, entries := range routes {
		p, err := netip.ParsePrefix(prefix)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.Installed {
				continue
			}
			for _, nh := range e.Nexthops {
				if a, err := netip.ParseAddr(nh.IP); err == nil && nh.FIB {
					got[p] = append(got[p], a)
				}
			}
		}
		sort.Slice(got[p], func(i, j int) bool { return got[p][i].Less(got[p][j]) })
	}
	return nil
}

// Stop stops FRR by PID; the routes it installed go with zebra.
func (r *BGPRouter) Stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		_ = r.procs[i].stop(5 * time.Second)
	}
	r.procs = nil
}
