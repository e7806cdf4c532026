package hybrid_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestHandle: a Handle decides on the key's own bucket, shared with the
// Limiter's AllowN on the same key, in every mode; it keeps deciding (on
// the key's new entry, against the same Redis bucket) after its entry is
// evicted; and it reports misuse when made and ErrClosed after Close.
func TestHandle(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{MaxKeys: 64}, func(t *testing.T, f *fleet) {
				l, ctx := f.lims[0], context.Background()
				lim := hybrid.Limit{Rate: slow, Burst: 30, Mode: mode}
				h, err := l.Handle("shared", lim)
				if err != nil {
					t.Fatal(err)
				}
				if h.Key() != "shared" || h.Limit() != lim {
					t.Fatalf("Key, Limit = %q, %+v", h.Key(), h.Limit())
				}
				allowed := 0
				decide := func(viaHandle bool) {
					t.Helper()
					var res hybrid.Result
					var err error
					if viaHandle {
						res, err = h.Allow(ctx)
					} else {
						res, err = l.Allow(ctx, "shared", lim)
					}
					if err != nil {
						t.Fatal(err)
					}
					if res.Source == hybrid.SourceFallback {
						t.Fatalf("decided by the fallback on a healthy Redis: %+v", res)
					}
					if res.Allowed {
						allowed++
					}
				}
				// Half the burst through each, interleaved.
				for i := range 15 {
					decide(i%2 == 0)
					decide(i%2 != 0)
				}
				if allowed != 30 {
					t.Fatalf("allowed %d of a burst of 30 through a Handle and AllowN together", allowed)
				}
				decide(true)
				decide(false)
				if allowed != 30 {
					t.Fatalf("allowed %d past a burst of 30", allowed)
				}

				// Evict the key's entry: other keys fill the store.
				settle(3 * interval)
				for i := range 200 {
					if _, err := l.Allow(ctx, "other-"+strconv.Itoa(i), lim); err != nil {
						t.Fatal(err)
					}
				}
				settle(3 * interval)
				before := l.Stats().Reconcile.Evicted
				if before == 0 {
					t.Fatal("no entry was evicted: the test does not test eviction")
				}
				decide(true)
				if allowed != 30 {
					t.Fatalf("after eviction the Handle allowed from a fresh bucket: %d", allowed)
				}
				settle(3 * interval)
				if got := tokensIn(t, f.m, "shared"); got >= 1e6 { // the refill since is below a token
					t.Fatalf("the Redis bucket holds %d micro-tokens after the burst was spent", got)
				}

				if _, err := l.Handle("", lim); !errors.Is(err, hybrid.ErrInvalidKey) {
					t.Fatalf("Handle of an empty key: %v, want ErrInvalidKey", err)
				}
				if _, err := l.Handle("k", hybrid.Limit{Rate: -1, Burst: 1}); !errors.Is(err, hybrid.ErrInvalidLimit) {
					t.Fatalf("Handle of a negative rate: %v, want ErrInvalidLimit", err)
				}
				if _, err := h.AllowN(ctx, -1); !errors.Is(err, hybrid.ErrInvalidCost) {
					t.Fatalf("AllowN(-1): %v, want ErrInvalidCost", err)
				}
				if err := l.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := h.Allow(ctx); !errors.Is(err, hybrid.ErrClosed) {
					t.Fatalf("Allow after Close: %v, want ErrClosed", err)
				}
			})
		})
	}
}

// TestHandleConcurrent: goroutines sharing a Handle and others calling
// AllowN on its key admit exactly the burst in lease mode, from one lease.
// A request denied while the lease is on its way (told to retry within a
// round trip) asks again after its RetryAfter, as a caller would; only the
// denials of a spent burst (a RetryAfter of the refill, 1,000 s a token)
// count as decisions.
func TestHandleConcurrent(t *testing.T) {
	inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
		l, ctx := f.lims[0], context.Background()
		lim := hybrid.Limit{Rate: slow, Burst: 500, Mode: hybrid.Lease}
		h, err := l.Handle("busy", lim)
		if err != nil {
			t.Fatal(err)
		}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := 0; i < 100; {
					var res hybrid.Result
					var err error
					if g%4 == 0 {
						res, err = l.Allow(ctx, "busy", lim)
					} else {
						res, err = h.Allow(ctx)
					}
					if err != nil {
						t.Error(err)
						return
					}
					if !res.Allowed && res.RetryAfter < time.Second {
						time.Sleep(res.RetryAfter)
						continue
					}
					i++
					if res.Allowed {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got := allowed.Load(); got != 500 {
			t.Fatalf("allowed %d of 1600 against a burst of 500", got)
		}
	})
}
