package l2key

import (
	"bytes"
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ebbdev/ebb/internal/announce/l2"
)

func TestEnsure(t *testing.T) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "ebb-system", Name: "ebb-l2-key"}
	t.Run("missing: created with a usable random key", func(t *testing.T) {
		c := fake.NewClientBuilder().Build()
		created, err := Ensure(ctx, c, key)
		if err != nil || !created {
			t.Fatalf("created %v, %v", created, err)
		}
		var s corev1.Secret
		if err := c.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		k, err := l2.ParseKeys(s.Data)
		if err != nil {
			t.Fatalf("the created Secret's keys do not parse: %v", err)
		}
		if k.SigningID() != FirstKeyID || len(s.Data[FirstKeyID]) != keyLen {
			t.Fatalf("signing with %q, key of %d bytes", k.SigningID(), len(s.Data[FirstKeyID]))
		}
		// Once there, it stays as it is.
		if created, err := Ensure(ctx, c, key); err != nil || created {
			t.Fatalf("second Ensure: created %v, %v", created, err)
		}
		var again corev1.Secret
		if err := c.Get(ctx, key, &again); err != nil || !bytes.Equal(again.Data[FirstKeyID], s.Data[FirstKeyID]) {
			t.Fatalf("the key changed: %v", err)
		}
		other := client.ObjectKey{Namespace: "ebb-system", Name: "other"}
		if _, err := Ensure(ctx, c, other); err != nil {
			t.Fatal(err)
		}
		var o corev1.Secret
		if err := c.Get(ctx, other, &o); err != nil || bytes.Equal(o.Data[FirstKeyID], s.Data[FirstKeyID]) {
			t.Fatalf("two Secrets got the same key (%v): not random", err)
		}
	})
	t.Run("the user's: left alone", func(t *testing.T) {
		mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Data: map[string][]byte{"old": []byte("0123456789abcdef"), "new": []byte("fedcba9876543210"), l2.SigningKeyField: []byte("new")}}
		c := fake.NewClientBuilder().WithObjects(mine).Build()
		if created, err := Ensure(ctx, c, key); err != nil || created {
			t.Fatalf("created %v, %v", created, err)
		}
		var s corev1.Secret
		if err := c.Get(ctx, key, &s); err != nil || len(s.Data) != 3 || string(s.Data[l2.SigningKeyField]) != "new" {
			t.Fatalf("the user's Secret changed: %v %v", s.Data, err)
		}
	})
}
