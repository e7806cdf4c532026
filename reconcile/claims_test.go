package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// kept spends e's local bucket (a fallback's share of 100 tokens, 100 a
// second, seeded empty) as it refills, 10 tokens every 100 ms for 3 s: the
// share keeps about 200 tokens of refill that a bucket nobody spent would
// have lost at its burst. Nothing is pending: the rounds charge nothing.
func kept(r *reconcile.Reconciler, e *reconcile.Entry) {
	share := local.Limit{Rate: 100 * M, Burst: 100 * M}
	e.TakeFrom(r.Clock().Now(), share, 0, 0, 0)
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		e.TakeFrom(r.Clock().Now(), share, 10*M, 0, 0)
	}
}

// TestClaimCarried: the outage's admissions charged in parts claim the
// refill their share kept in full, whatever part comes first: a first part
// smaller than what was kept (a settlement in doubt, sent again as it was)
// leaves the rest to the next. Before, the first part's claim was capped at
// its own consumption and the rest was lost, charged in full.
func TestClaimCarried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, HeartbeatInterval: time.Hour, ShareCredit: true})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 100, 100, reconcile.Lease))
		kept(r, e)
		e.Pending.Add(9 * M)
		r.Keys().Get("k") // touched: the next round settles it
		time.Sleep(100 * time.Millisecond)
		e.Pending.Add(150 * M)
		r.Keys().Get("k")
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		st.mu.Lock()
		claimed := st.claims["k"]
		st.mu.Unlock()
		if claimed != 159*M {
			t.Fatalf("claimed %d micro-tokens of two charges of 9 and 150 tokens after keeping about 200: want %d, all of them", claimed, 159*M)
		}
	})
}

// TestTopUpClaims: an early top-up that comes first after an outage
// charges what the fallback admitted with its claim, as a round does.
// Before, it took the consumption raw and charged it in full.
func TestTopUpClaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		// Rounds every 10 s: a top-up comes at once once a quarter of
		// that has passed since the last.
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 10 * time.Second, HeartbeatInterval: time.Hour, ShareCredit: true})
		defer r.Close(context.Background())
		sp := spec(t, 100, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		if err := r.Fetch(context.Background(), e, M); err != nil { // a lease and a view
			t.Fatal(err)
		}
		kept(r, e)
		e.Pending.Add(50 * M)
		r.SetView(e, local.View{Tokens: 100 * M, Seen: r.Clock().Now()})
		e.Allowance.Spend(e.Allowance.Load())
		r.Starved(e, true)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		st.mu.Lock()
		claimed, settles := st.claims["k"], st.settles
		st.mu.Unlock()
		if settles < 2 {
			t.Fatalf("%d calls: the top-up did not come", settles)
		}
		if e.Pending.Load() != 0 {
			t.Fatalf("%d micro-tokens still pending after the top-up", e.Pending.Load())
		}
		if claimed != 50*M {
			t.Fatalf("the top-up claimed %d micro-tokens of 50 tokens charged: want all of them", claimed)
		}
	})
}
