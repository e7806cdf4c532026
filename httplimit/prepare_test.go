package httplimit_test

import (
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestPrepareChecks: tiers without a name get one, long keys their bucket
// key, the caller's slice is left as it was, and an invalid key names its
// tier.
func TestPrepareChecks(t *testing.T) {
	lim := hybrid.Limit{Rate: 1, Burst: 1}
	long := strings.Repeat("k", 300)
	in := []hybrid.Check{{Key: "a", Limit: lim}, {Tier: "t", Key: long, Limit: lim}}
	out, err := httplimit.PrepareChecks(in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := httplimit.BucketKey(long)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Tier != "tier0" || out[0].Key != "a" || out[1].Tier != "t" || out[1].Key != want || want == long {
		t.Errorf("PrepareChecks = %+v, want tier0/a and t/%s", out, want)
	}
	if in[0].Tier != "" || in[1].Key != long {
		t.Errorf("the caller's checks changed: %+v", in)
	}
	one, err := httplimit.PrepareChecks([]hybrid.Check{{Key: "a", Limit: lim}})
	if err != nil || one[0].Tier != "default" {
		t.Errorf("a lone check: %+v, %v; want tier default", one, err)
	}
	same := []hybrid.Check{{Tier: "x", Key: "a", Limit: lim}}
	if got, err := httplimit.PrepareChecks(same); err != nil || &got[0] != &same[0] {
		t.Errorf("checks with nothing to change were copied: %v", err)
	}
	_, err = httplimit.PrepareChecks([]hybrid.Check{{Tier: "bad", Key: "", Limit: lim}})
	if err == nil || !strings.Contains(err.Error(), `tier "bad"`) {
		t.Errorf("an empty key: %v, want an error naming tier bad", err)
	}
}
