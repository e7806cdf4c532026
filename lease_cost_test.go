package hybrid_test

import (
	"testing"

	"github.com/hybridlimit/hybrid"
)

// TestLeaseCostAboveAllowance: in lease mode, a request that costs more than
// this instance's lease holds, but no more than the lease and the bucket in
// Redis hold together, is allowed (a fetch adds what is missing to the
// lease); it is not denied on the bucket's last view alone.
func TestLeaseCostAboveAllowance(t *testing.T) {
	inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
		lim := hybrid.Limit{Rate: slow, Burst: 30}
		// Three requests of 10 spend the burst; the lease grows as they
		// come, so the third finds part of its cost in the lease and the
		// rest in Redis.
		for i, want := range []bool{true, true, true, false} {
			res, err := f.lims[0].AllowN(t.Context(), "k", lim, 10)
			if err != nil || res.Allowed != want {
				t.Fatalf("AllowN #%d of 10 tokens out of 30 = %+v, %v; want Allowed %v", i+1, res, err, want)
			}
		}
		wantTokens(t, f.m, "k", 0, 1000)
	})
}
