package httplimit_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/httplimit"
)

// TestBucketKey: short keys are themselves, long ones and lookalikes of
// hashed ones are hashed, the empty key is ErrNoKey.
func TestBucketKey(t *testing.T) {
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	long := strings.Repeat("k", 257)
	tests := []struct {
		key, want string
	}{
		{"ip:198.51.100.7", "ip:198.51.100.7"},
		{strings.Repeat("k", 256), strings.Repeat("k", 256)},
		{long, hash(long)},
		{hash(long), hash(hash(long))},
		{"sha256:", hash("sha256:")},
	}
	for _, tt := range tests {
		got, err := httplimit.BucketKey(tt.key)
		if got != tt.want || err != nil {
			t.Errorf("BucketKey(%.20q, %d bytes) = %.20q, %v; want %.20q", tt.key, len(tt.key), got, err, tt.want)
		}
	}
	if got, err := httplimit.BucketKey(""); got != "" || !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf(`BucketKey("") = %q, %v; want ErrNoKey`, got, err)
	}
}
