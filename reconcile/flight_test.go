package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/reconcile"
)

// TestFetchGivenUp: a request that makes its lease key's fetch itself and
// gives up on the reply (its context ends, or ColdWait passes) leaves the
// fetch to finish: the grant joins the key's allowance when the reply comes,
// not lost, and a request that joined the fetch meanwhile gets its outcome
// (or gives up after ColdWait too).
func TestFetchGivenUp(t *testing.T) {
	for _, how := range []string{"context", "ColdWait"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newStore()
				r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, ColdWait: 20 * time.Millisecond})
				defer r.Close(context.Background())
				sp := spec(t, 10, 100, reconcile.Lease)
				gate := make(chan struct{})
				st.set(func(s *store) { s.gate = gate })
				// Two calls on their way (as many as an instance alone
				// sends at once) hold the key's fetch in the next batch.
				for _, key := range []string{"a", "b"} {
					go r.SettleNow(context.Background(), global.Settlement{Key: key, Limit: sp.Limit, Want: M, MinGrant: M, Quantum: M})
				}
				synctest.Wait()
				e := entry(r, "k", sp)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				lead, join := make(chan error, 1), make(chan error, 1)
				start := time.Now()
				go func() { lead <- r.Fetch(ctx, e, 5*M) }()
				synctest.Wait()
				go func() { join <- r.Fetch(context.Background(), e, M) }()
				synctest.Wait()
				if how == "context" {
					cancel()
					if err := <-lead; !errors.Is(err, context.Canceled) {
						t.Fatalf("Fetch whose context ended = %v, want context.Canceled", err)
					}
				} else {
					if err := <-lead; !errors.Is(err, reconcile.ErrNoAnswer) || time.Since(start) != 20*time.Millisecond {
						t.Fatalf("Fetch = %v after %v, want ErrNoAnswer after ColdWait (20ms)", err, time.Since(start))
					}
					// The request that joined it waited as long.
					if err := <-join; !errors.Is(err, reconcile.ErrNoAnswer) {
						t.Fatalf("the request that joined the fetch got %v, want ErrNoAnswer", err)
					}
					if s := r.Stats(); s.FetchTimeouts != 2 {
						t.Fatalf("FetchTimeouts = %d, want 2", s.FetchTimeouts)
					}
				}
				if got := e.Allowance.Load(); got != 0 {
					t.Fatalf("allowance %d before the reply, want 0", got)
				}
				if how == "context" {
					select {
					case err := <-join:
						t.Fatalf("the request that joined the fetch got %v before its reply", err)
					default:
					}
				}
				close(gate)
				synctest.Wait()
				if how == "context" {
					if err := <-join; err != nil {
						t.Fatalf("the request that joined the fetch got %v, want its outcome: nil", err)
					}
				}
				if got := e.Allowance.Load(); got < 5*M {
					t.Fatalf("allowance %d after the reply, want the grant, 5 tokens at least", got)
				}
				if got, _ := st.get("k"); got != 100*M-e.Allowance.Load() {
					t.Fatalf("the bucket holds %d, want the burst less the grant (%d)", got, e.Allowance.Load())
				}
			})
		})
	}
}
