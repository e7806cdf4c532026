package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// Wait and WaitN: a waiter wakes when a token is due, waiters take turns.

// TestWait: WaitN on an exhausted bucket returns once the bucket has
// refilled, about RetryAfter later; with a deadline too close it returns
// ErrWouldWait at once; a cancelled ctx ends it with ctx's error.
func TestWait(t *testing.T) {
	lim := hybrid.Limit{Rate: 1, Burst: 1}
	// exhaust spends the key's only token and returns the denial's
	// RetryAfter.
	exhaust := func(t *testing.T, l *hybrid.Limiter, key string) time.Duration {
		t.Helper()
		if res, err := l.Allow(context.Background(), key, lim); err != nil || !res.Allowed {
			t.Fatalf("Allow(%s) = %+v, %v, want allowed", key, res, err)
		}
		res, err := l.Allow(context.Background(), key, lim)
		if err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Fatalf("Allow(%s) = %+v, %v, want denied with a RetryAfter", key, res, err)
		}
		return res.RetryAfter
	}

	t.Run("waits", func(t *testing.T) {
		inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
			l := f.lims[0]
			retry := exhaust(t, l, "k")
			start := time.Now()
			if err := l.WaitN(context.Background(), "k", lim, 1); err != nil {
				t.Fatalf("WaitN = %v", err)
			}
			// The token is back in Redis one second after it was taken, and
			// WaitN fetches it then, not at the next round.
			got := time.Since(start)
			t.Logf("RetryAfter %v; WaitN returned after %v", retry, got)
			if got < time.Second || got > retry+time.Millisecond {
				t.Errorf("WaitN returned after %v, want between 1s (the refill) and RetryAfter %v + 1ms", got, retry)
			}
		})
	})

	t.Run("deadline too close", func(t *testing.T) {
		inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
			l := f.lims[0]
			retry := exhaust(t, l, "k")
			ctx, cancel := context.WithTimeout(context.Background(), retry/2)
			defer cancel()
			start := time.Now()
			err := l.WaitN(ctx, "k", lim, 1)
			if !errors.Is(err, hybrid.ErrWouldWait) {
				t.Errorf("WaitN with a deadline in %v, RetryAfter %v: %v, want ErrWouldWait", retry/2, retry, err)
			}
			if got := time.Since(start); got != 0 {
				t.Errorf("WaitN took %v to give up, want 0", got)
			}
		})
	})

	t.Run("cancelled", func(t *testing.T) {
		inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
			l := f.lims[0]
			exhaust(t, l, "k")
			ctx, cancel := context.WithCancel(context.Background())
			const after = 300 * time.Millisecond
			go func() {
				time.Sleep(after)
				cancel()
			}()
			start := time.Now()
			if err := l.Wait(ctx, "k", lim); !errors.Is(err, context.Canceled) {
				t.Errorf("Wait, cancelled after %v: %v, want context.Canceled", after, err)
			}
			if got := time.Since(start); got != after {
				t.Errorf("Wait returned after %v, want %v (when ctx was cancelled)", got, after)
			}
			if err := l.Wait(ctx, "k", lim); !errors.Is(err, context.Canceled) {
				t.Errorf("Wait with a cancelled ctx: %v, want context.Canceled", err)
			}
		})
	})
}

// TestWaitLine: many waiters on one key wake one by one as the bucket
// refills, not all at once whenever a token is due: 20 WaitN calls on a
// key of 100/s, burst 1, all return within 20 tokens' time, and make about
// one decision each (all 20 waking for each token would make 210).
func TestWaitLine(t *testing.T) {
	lim := hybrid.Limit{Rate: 100, Burst: 1}
	inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		if res, err := l.Allow(ctx, "k", lim); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		decisions := func() uint64 {
			st := l.Stats()
			return st.LocalAllowed + st.LocalDenied + st.RedisAllowed + st.RedisDenied
		}
		before := decisions()
		start := time.Now()
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if err := l.Wait(ctx, "k", lim); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		settle(2 * interval) // LocalAllowed is counted at the rounds
		made := decisions() - before
		t.Logf("20 waiters done in %v with %d decisions", took, made)
		if took > 200*time.Millisecond+time.Millisecond {
			t.Errorf("20 waiters took %v, want the 20 tokens' 200ms", took)
		}
		if made > 3*20 {
			t.Errorf("20 waiters made %d decisions, want about one each", made)
		}
	})
}

// TestWaitOffRound: a lone waiter on a limit of 1 a second, burst 1, gets
// as many tokens as x/time/rate's Wait, less the one its first call found
// before the limiter's first view, in 20 s, in every mode, with the rounds a
// nanosecond or a third of an interval off the requests' times (as a
// Limiter's random first round puts them). A view rounded to Redis's
// microseconds makes the waiter come a microsecond early at times; it kept
// its place in line (it lost a whole turn: 18 tokens of 21).
func TestWaitOffRound(t *testing.T) {
	for _, phase := range []time.Duration{1, 33333333} {
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
			t.Run(fmt.Sprintf("phase=%v/%v", phase, mode), func(t *testing.T) {
				defer hybrid.SetFirstRound(phase)()
				lim := hybrid.Limit{Rate: 1, Burst: 1, Mode: mode}
				inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
					ours, theirs := waiter(t, f.lims[0], "w", lim, 20*time.Second)
					if ours < theirs-1 {
						t.Errorf("a lone waiter got %d tokens in 20 s, x/time/rate %d", ours, theirs)
					}
				})
			})
		}
	}
}
