package l2

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Keys authenticate heartbeats: each frame carries the ID of the key that
// signed it and an HMAC-SHA256 of the whole frame under that key. A replica
// signs with the signing key and accepts a frame signed with any of the
// keys, so that keys can be rotated without a moment in which two replicas
// refuse each other (docs/l2.md, "Rotating the heartbeat key"). A frame
// from a host on the segment without a key (any pod or host with NET_RAW
// can send one) is refused before it is parsed further.
type Keys struct {
	signing string
	byID    map[string][]byte
	// fingerprints are the first 8 hex digits of each key's SHA-256.
	fingerprints map[string]string
}

// SigningKeyField is the Secret field that names the signing key; every
// other field is a key, its name the key's ID.
const SigningKeyField = "signing-key"

// MinKeyLen is the shortest key accepted: 128 bits.
const MinKeyLen = 16

// maxKeyID is the longest key ID (it goes in every frame).
const maxKeyID = 32

// macLen is the length of a frame's HMAC-SHA256.
const macLen = sha256.Size

// ParseKeys reads keys from a Secret's data: every field but SigningKeyField
// is a key named by its field, and SigningKeyField names the one to sign
// with (optional when there is only one key).
func ParseKeys(data map[string][]byte) (*Keys, error) {
	k := &Keys{byID: map[string][]byte{}, fingerprints: map[string]string{}}
	for id, key := range data {
		if id == SigningKeyField {
			continue
		}
		if len(id) == 0 || len(id) > maxKeyID {
			return nil, fmt.Errorf("key ID %q: want 1 to %d bytes", id, maxKeyID)
		}
		if len(key) < MinKeyLen {
			return nil, fmt.Errorf("key %q is %d bytes: want at least %d random bytes (head -c 32 /dev/urandom)", id, len(key), MinKeyLen)
		}
		k.byID[id] = slices.Clone(key)
		sum := sha256.Sum256(key)
		k.fingerprints[id] = hex.EncodeToString(sum[:4])
	}
	if len(k.byID) == 0 {
		return nil, errors.New("no key: add a field of at least 16 random bytes")
	}
	switch name := strings.TrimSpace(string(data[SigningKeyField])); {
	case name != "":
		if k.byID[name] == nil {
			return nil, fmt.Errorf("%s names key %q, which is not there", SigningKeyField, name)
		}
		k.signing = name
	case len(k.byID) == 1:
		for id := range k.byID {
			k.signing = id
		}
	default:
		return nil, fmt.Errorf("%d keys and no %s field naming the one to sign with", len(k.byID), SigningKeyField)
	}
	return k, nil
}

// SigningID is the ID of the key frames are signed with.
func (k *Keys) SigningID() string { return k.signing }

// IDs are the IDs of the keys frames are accepted with, sorted.
func (k *Keys) IDs() []string {
	ids := make([]string, 0, len(k.byID))
	for id := range k.byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Fingerprints are the keys as "ID:fingerprint", sorted: the fingerprint
// (the first 8 hex digits of the key's SHA-256) tells two keys of one ID
// apart, e.g. a Secret deleted and created again with a new key-1.
func (k *Keys) Fingerprints() []string {
	out := make([]string, 0, len(k.byID))
	for _, id := range k.IDs() {
		out = append(out, id+":"+k.fingerprint(id))
	}
	return out
}

func (k *Keys) fingerprint(id string) string { return k.fingerprints[id] }

// sign appends the MAC of b under the signing key.
func (k *Keys) sign(b []byte) []byte {
	m := hmac.New(sha256.New, k.byID[k.signing])
	m.Write(b)
	return m.Sum(b)
}

// verify reports whether mac is the MAC of b under the key id.
func (k *Keys) verify(id string, b, mac []byte) bool {
	key := k.byID[id]
	if key == nil {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return hmac.Equal(m.Sum(nil), mac)
}
