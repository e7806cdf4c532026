package hybrid_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/hybridlimit/hybrid"
)

// TestLongTailOneCall: per-user keys, each asked once in a while, in lease
// mode, from a fleet of 2. Each decision costs one script call, a fetch of
// the request's token alone: the rounds after it send nothing for the key
// (nothing was reserved beyond the request, so nothing goes back), and the
// key's hash in Redis holds the bucket alone, t and ts, whichever instances
// asked for it.
func TestLongTailOneCall(t *testing.T) {
	inFleet(t, 2, hybrid.Config{}, func(t *testing.T, f *fleet) {
		lim := hybrid.Limit{Rate: 10.0 / 60, Burst: 20}
		const keys, passes = 200, 3
		ctx := context.Background()
		for p := range passes {
			for k := range keys {
				l := f.lims[(k+p)%len(f.lims)] // each pass from another instance
				res, err := l.Allow(ctx, fmt.Sprint("user", k), lim)
				if err != nil || !res.Allowed || res.Source != hybrid.SourceRedis {
					t.Fatalf("pass %d, key %d: %+v, %v; want allowed, fetched", p, k, res, err)
				}
			}
			settle(3 * interval) // rounds: nothing to settle for these keys
		}
		var fetches, settled uint64
		for _, l := range f.lims {
			st := l.Stats().Reconcile
			fetches += st.Fetches
			settled += st.KeysSettled
		}
		t.Logf("%d fetches, %d keys settled", fetches, settled)
		if want := uint64(keys * passes); fetches != want || settled != want {
			t.Errorf("%d fetches, %d keys settled for %d decisions, want one each: a call a decision", fetches, settled, want)
		}
		for k := range keys {
			rk := fmt.Sprint("hybrid:{user", k, "}")
			if typ := f.m.Type(rk); typ != "string" {
				t.Fatalf("%s is a %s, want the bucket alone (a string: no record)", rk, typ)
			}
		}
	})
}
