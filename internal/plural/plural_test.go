package plural_test

import (
	"testing"

	"github.com/hybridlimit/hybrid/internal/plural"
)

func TestCount(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 tokens"},
		{1, "1 token"},
		{2, "2 tokens"},
		{-1, "-1 token"},
		{-3, "-3 tokens"},
		{1_000_000, "1000000 tokens"},
	}
	for _, tt := range tests {
		if got := plural.Count(tt.n, "token"); got != tt.want {
			t.Errorf("Count(%d, token) = %q, want %q", tt.n, got, tt.want)
		}
	}
	for noun, want := range map[string]string{"pass": "2 passes", "box": "2 boxes", "batch": "2 batches", "key": "2 keys"} {
		if got := plural.Count(2, noun); got != want {
			t.Errorf("Count(2, %s) = %q, want %q", noun, got, want)
		}
	}
	if got := plural.Count(1, "key"); got != "1 key" {
		t.Errorf("Count(1, key) = %q", got)
	}
	if got := plural.Count(7, "second"); got != "7 seconds" {
		t.Errorf("Count(7, second) = %q", got)
	}
}
