package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// TestFirstRound: the first round comes FirstRound after New, and the
// others every SyncInterval after it; 0, or more than SyncInterval, means
// SyncInterval.
func TestFirstRound(t *testing.T) {
	for _, c := range []struct {
		first, want time.Duration
	}{
		{30 * time.Millisecond, 30 * time.Millisecond},
		{0, 100 * time.Millisecond},
		{time.Second, 100 * time.Millisecond},
	} {
		t.Run(c.first.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newStore()
				r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, FirstRound: c.first})
				defer r.Close(context.Background())
				sp := spec(t, 10, 100, reconcile.Optimistic)
				start := time.Now()
				for i := range 3 {
					entry(r, "k", sp).Pending.Add(M) // touched: the next round settles it
					// Just before the round is due: nothing yet.
					time.Sleep(c.want + time.Duration(i)*100*time.Millisecond - time.Since(start) - time.Millisecond)
					synctest.Wait()
					if n, _ := st.counts(); n != i {
						t.Fatalf("round %d: %d Settle calls a millisecond before it is due, want %d", i, n, i)
					}
					time.Sleep(time.Millisecond)
					synctest.Wait()
					if n, _ := st.counts(); n != i+1 {
						t.Fatalf("round %d: %d Settle calls when it is due, want %d", i, n, i+1)
					}
				}
			})
		})
	}
}
