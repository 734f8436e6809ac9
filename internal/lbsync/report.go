package lbsync

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/dataplane"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;create;delete
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports/status,verbs=get;update

// Reporter publishes this replica's LoadBalancerReport: per node, the
// admin state applied and the established connections through it. A
// change of admin state, or of the connections through a leaving node, is
// written within a poll interval; everything else at each heartbeat.
type Reporter struct {
	Client    client.Client
	DataPlane *dataplane.DataPlane
	// Name of the report object and of the replica.
	Name      string
	Heartbeat time.Duration
	Poll      time.Duration

	// HostNode is the node this replica runs on; empty: unknown.
	HostNode string
	// Announcement, if set, says how the replica announces its addresses
	// now (read at every poll; a change is written at once).
	Announcement func() *v1alpha1.Announcement
	// Served, if set, lists the addresses the replica takes traffic for
	// now (read at every poll; a change is written at once, since the
	// controller publishes a Service's address once it is served).
	Served func() []string

	// retired: a successor process serves in this replica's place, so it
	// sends no node a new connection (Retire).
	retired atomic.Bool
	// draining: the host is leaving and the replica withdrew its
	// announcements (SetDraining).
	draining atomic.Bool
	// joining: the replica started announcing a short while ago, at
	// joinTime (SetJoining).
	joining  atomic.Bool
	joinTime atomic.Pointer[time.Time]
	// lastWrite is when Run started or last wrote the report (Unix ns);
	// 0 before Run.
	lastWrite atomic.Int64
}

// SilentFor reports whether the report has not been written for longer
// than d since Run started: the replica cannot reach the API server (or
// the server refuses it), so what it knows of the cluster is getting
// stale. False before Run.
func (r *Reporter) SilentFor(d time.Duration) bool {
	at := r.lastWrite.Load()
	return at != 0 && time.Since(time.Unix(0, at)) > d
}

// CutOff reports whether the report has not been written for a heartbeat
// and a half: one write that was due failed, at least (Syncer.CutOff).
func (r *Reporter) CutOff() bool { return r.SilentFor(r.heartbeat() * 3 / 2) }

// heartbeat is Heartbeat, or its default.
func (r *Reporter) heartbeat() time.Duration {
	if r.Heartbeat <= 0 {
		return 10 * time.Second
	}
	return r.Heartbeat
}

// SetJoining says whether the replica started announcing a short while ago
// (at since) and forwards the segments of the flows the routers move to it.
func (r *Reporter) SetJoining(on bool, since time.Time) {
	r.joinTime.Store(&since)
	r.joining.Store(on)
}

// Retire makes the report say what a replica that handed its sockets to a
// successor does: every node is Down for it (it takes no new connection),
// it is draining, and its established connections are counted down as
// they end.
func (r *Reporter) Retire() { r.retired.Store(true) }

// SetDraining says whether the replica's host is leaving and the replica
// withdrew its announcements: NodeMaintenance of the host waits for it and
// for the replica's own connections to end.
func (r *Reporter) SetDraining(on bool) { r.draining.Store(on) }

// isDraining is what the report says: draining or retired.
func (r *Reporter) isDraining() bool { return r.draining.Load() || r.retired.Load() }

// Run reports until ctx is done.
func (r *Reporter) Run(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx).WithName("report")
	heartbeat := r.heartbeat()
	if r.Poll <= 0 {
		r.Poll = 100 * time.Millisecond
	}
	r.lastWrite.Store(time.Now().UnixNano())
	var last []v1alpha1.NodeTraffic
	var written, retryAt time.Time
	var backoff time.Duration
	var wroteDraining, wroteJoining bool
	var wroteAnn *v1alpha1.Announcement
	var wroteServed []string
	tick := time.NewTicker(r.Poll)
	defer tick.Stop()
	for {
		nodes := NodeTraffic(r.DataPlane.Status())
		if r.retired.Load() {
			for i := range nodes {
				nodes[i].AdminState = v1alpha1.AdminStateDown
			}
		}
		draining, joining := r.isDraining(), r.joining.Load()
		var ann *v1alpha1.Announcement
		if r.Announcement != nil {
			ann = r.Announcement()
		}
		var served []string
		if r.Served != nil && !draining {
			served = r.Served()
		}
		due := urgent(last, nodes) || draining != wroteDraining || joining != wroteJoining || time.Since(written) >= heartbeat ||
			!equality.Semantic.DeepEqual(ann, wroteAnn) || !slices.Equal(served, wroteServed)
		// While draining, the replica's own connections are what its
		// host's maintenance waits for: write each change.
		if draining && total(last) != total(nodes) {
			due = true
		}
		if due && time.Now().After(retryAt) {
			if err := r.write(ctx, nodes, draining, joining, ann, served); err != nil {
				// Back off, so that a rejected write (say, a token no
				// longer valid) is not retried at every poll.
				backoff = min(max(2*backoff, time.Second), heartbeat)
				retryAt = time.Now().Add(backoff)
				log.Error(err, "Writing the load balancer report", "retryIn", backoff)
			} else {
				last, written, backoff, wroteDraining, wroteJoining, wroteAnn, wroteServed = nodes, time.Now(), 0, draining, joining, ann, served
				r.lastWrite.Store(written.UnixNano())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Remove deletes the report: the replica is gone, so nothing it said
// holds (a report left behind would stay fresh for three heartbeats and
// keep its host looking served). A replica that crashes leaves it to go
// stale.
func (r *Reporter) Remove(ctx context.Context) error {
	report := &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: r.Name}}
	if err := r.Client.Delete(ctx, report); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting LoadBalancerReport %s: %w", r.Name, err)
	}
	return nil
}

// NodeTraffic sums the data plane's backends per owning node.
func NodeTraffic(status []dataplane.BackendStatus) []v1alpha1.NodeTraffic {
	byNode := map[string]*v1alpha1.NodeTraffic{}
	for _, b := range status {
		if b.Owner == "" {
			continue
		}
		n, ok := byNode[b.Owner]
		if !ok {
			n = &v1alpha1.NodeTraffic{Name: b.Owner, AdminState: v1alpha1.AdminStateNone}
			byNode[b.Owner] = n
		}
		if b.AdminState == dataplane.AdminDown {
			n.AdminState = v1alpha1.AdminStateDown
		}
		n.Connections += b.Active
	}
	out := make([]v1alpha1.NodeTraffic, 0, len(byNode))
	for _, n := range byNode {
		out = append(out, *n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// urgent reports whether a change must be written now: a node appeared,
// went or changed admin state, or the connections through a leaving node
// changed.
func urgent(last, now []v1alpha1.NodeTraffic) bool {
	if len(last) != len(now) {
		return true
	}
	for i := range now {
		l, n := last[i], now[i]
		if l.Name != n.Name || l.AdminState != n.AdminState {
			return true
		}
		if n.AdminState == v1alpha1.AdminStateDown && l.Connections != n.Connections {
			return true
		}
	}
	return false
}

func (r *Reporter) joinTimeStatus() *metav1.Time {
	if t := r.joinTime.Load(); t != nil {
		mt := metav1.NewTime(*t)
		return &mt
	}
	return nil
}

// total sums the connections over nodes.
func total(nodes []v1alpha1.NodeTraffic) int64 {
	var n int64
	for _, t := range nodes {
		n += t.Connections
	}
	return n
}

func (r *Reporter) write(ctx context.Context, nodes []v1alpha1.NodeTraffic, draining, joining bool, ann *v1alpha1.Announcement, served []string) error {
	report := &v1alpha1.LoadBalancerReport{}
	err := r.Client.Get(ctx, client.ObjectKey{Name: r.Name}, report)
	if apierrors.IsNotFound(err) {
		report = &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: r.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "ebb-lb"}}}
		if err := r.Client.Create(ctx, report); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating LoadBalancerReport %s: %w", r.Name, err)
		}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: r.Name}, report); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("reading LoadBalancerReport %s: %w", r.Name, err)
	}
	now := metav1.NowMicro()
	report.Status = v1alpha1.LoadBalancerReportStatus{
		Replica: r.Name, HostNode: r.HostNode, Draining: draining, Joining: joining && !draining, JoinTime: r.joinTimeStatus(),
		RenewTime: &now, HeartbeatSeconds: int32(r.heartbeat() / time.Second), Nodes: slices.Clone(nodes),
		NodeCount: int32(len(nodes)), Announcement: ann, Served: served,
	}
	for _, n := range nodes {
		report.Status.Connections += n.Connections
		if n.AdminState == v1alpha1.AdminStateDown {
			report.Status.LeavingNodes++
		}
	}
	if err := r.Client.Status().Update(ctx, report); err != nil {
		return fmt.Errorf("updating LoadBalancerReport %s: %w", r.Name, err)
	}
	return nil
}
