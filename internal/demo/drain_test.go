package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The demo's drain waits out an API server that is away or busy, and
// stops at once on an answer that will not change.
func TestTransient(t *testing.T) {
	nm := schema.GroupResource{Group: "maintenance.ebb.dev", Resource: "nodemaintenances"}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"conflict", apierrors.NewConflict(nm, "a", errors.New("modified")), true},
		{"unavailable", apierrors.NewServiceUnavailable("etcd away"), true},
		{"too many requests", apierrors.NewTooManyRequests("busy", 1), true},
		{"connection refused", fmt.Errorf("get: %w", refused), true},
		{"cut short", fmt.Errorf("get: %w", io.ErrUnexpectedEOF), true},
		{"a request that timed out", context.DeadlineExceeded, true},
		{"not found", apierrors.NewNotFound(nm, "a"), false},
		{"forbidden", apierrors.NewForbidden(nm, "a", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("spec.stage can only move forward"), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("%s: transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// untilWritten retries a conflict and returns another error at once.
func TestUntilWritten(t *testing.T) {
	nm := schema.GroupResource{Group: "maintenance.ebb.dev", Resource: "nodemaintenances"}
	calls := 0
	err := untilWritten(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return apierrors.NewConflict(nm, "a", errors.New("modified"))
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("after two conflicts: %v, %d calls, want nil and 3", err, calls)
	}
	calls = 0
	denied := apierrors.NewForbidden(nm, "a", errors.New("denied by a webhook"))
	err = untilWritten(context.Background(), func(context.Context) error { calls++; return denied })
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Errorf("a denial: %v after %d calls, want it at once", err, calls)
	}
}
