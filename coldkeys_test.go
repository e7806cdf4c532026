package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// Keys this instance holds nothing for: the first fetch, optimistic cold
// keys, eviction from the store, and leases that go back when a key idles.

// TestColdKeyOneFetch: 50 requests for a key this instance has never seen,
// all at once, share the fetch from Redis, and admit exactly what the bucket
// held: no request is denied while Redis still holds tokens for it.
func TestColdKeyOneFetch(t *testing.T) {
	for _, burst := range []int64{20, 50} {
		t.Run(fmt.Sprint("burst ", burst), func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				lim := hybrid.Limit{Rate: slow, Burst: burst}
				const callers = 50
				var c tally
				var wg sync.WaitGroup
				start := make(chan struct{})
				for range callers {
					wg.Go(func() {
						<-start
						c.add(l.Allow(context.Background(), "cold", lim))
					})
				}
				close(start)
				wg.Wait()
				c.check(t)
				st := l.Stats()
				t.Logf("%d allowed, %d denied; %d fetches, %d requests waited for one, %d denied after one, %d denied unanswered (%d fetches waited out)",
					c.allowed.Load(), c.denied.Load(), st.Reconcile.Fetches, st.Fetched, st.RedisDenied, st.Unanswered, st.Reconcile.FetchTimeouts)
				if got, want := c.allowed.Load(), min(burst, callers); got != want {
					t.Errorf("%d concurrent requests on a cold key with burst %d: %d allowed, want %d", callers, burst, got, want)
				}
				// Callers that come after a fetch has returned start another
				// one, and a fetch grants a lease, not the whole bucket: a
				// few fetches, far fewer than callers.
				if st.Reconcile.Fetches > callers/5 {
					t.Errorf("%d fetches for %d callers of one cold key, want them shared (at most %d)", st.Reconcile.Fetches, callers, callers/5)
				}
			})
		})
	}
}

// TestColdKeyOptimistic: 50 requests at once for a key this instance has
// never seen, under an optimistic limit, on a lone instance: the first is
// admitted on trust, the others share one fetch whose budget counts it, so
// exactly the burst is admitted. The callers race to set the key up, so the
// test tries many keys.
func TestColdKeyOptimistic(t *testing.T) {
	const (
		burst   = 20
		callers = 50
		keys    = 3000
	)
	lim := hybrid.Limit{Rate: slow, Burst: burst, Mode: hybrid.Optimistic}
	inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		bad := 0
		for k := range keys {
			key := fmt.Sprint("cold-", k)
			var c tally
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range callers {
				wg.Go(func() {
					<-start
					c.add(l.Allow(context.Background(), key, lim))
				})
			}
			close(start)
			wg.Wait()
			c.check(t)
			if got := c.allowed.Load(); got != burst {
				if bad++; bad <= 3 {
					t.Errorf("%s: %d concurrent requests on a cold key with burst %d: %d allowed (%d here, %d on Redis's answer), want %d; Redis holds %d micro-tokens; %+v",
						key, callers, burst, got, c.bySource[hybrid.SourceLocal].Load(), c.bySource[hybrid.SourceRedis].Load(), burst, tokensIn(t, f.m, key), l.Stats())
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d of %d cold keys admitted more or less than their burst", bad, keys)
		}
	})
}

// TestEviction: a store of 10 keys, 100 keys touched once each. What an
// evicted key owes is settled at the next round: under an optimistic limit
// its pending consumption is charged; under a lease, the unspent part of its
// lease goes back. Once the rounds are done, Redis holds for each key its
// burst less what was admitted, and nothing is left owing.
func TestEviction(t *testing.T) {
	const (
		keys  = 100
		burst = 20 // a lease of 5 tokens: 4 go back on eviction
	)
	tests := []struct {
		mode   hybrid.Mode
		rounds int // until everything is settled
	}{
		{hybrid.Optimistic, 1},
		// The keys still tracked hold their leases for a round more.
		{hybrid.Lease, 3},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{MaxKeys: 10}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				lim := hybrid.Limit{Rate: slow, Burst: burst, Mode: tt.mode}
				start := time.Now()
				admitted := 0
				for i := range keys {
					res, err := l.Allow(context.Background(), fmt.Sprint("k", i), lim)
					if err != nil {
						t.Fatalf("Allow(k%d) = %v", i, err)
					}
					if res.Allowed {
						admitted++
					}
				}
				if admitted != keys {
					t.Errorf("%d of %d new keys admitted, want all", admitted, keys)
				}
				st := l.Stats()
				if st.Reconcile.Keys > 10 || st.Reconcile.Evicted < keys-10 {
					t.Errorf("Stats: %d keys tracked, %d evicted, want at most 10 and at least %d", st.Reconcile.Keys, st.Reconcile.Evicted, keys-10)
				}
				settle(time.Duration(tt.rounds) * interval)
				slack := int64(slow*micro*time.Since(start).Seconds()) + 1
				var charged int64
				for i := range keys {
					charged += burst*micro - tokensIn(t, f.m, fmt.Sprint("k", i))
				}
				if want := int64(admitted) * micro; charged > want || charged < want-keys*slack {
					t.Errorf("Redis was charged %d micro-tokens for %d admitted, want %d (less at most %d of refill)", charged, admitted, want, keys*slack)
				}
				if st := l.Stats(); st.Reconcile.Orphans != 0 || st.Reconcile.KeyErrors != 0 {
					t.Errorf("after the rounds: %d orphans, %d key errors, want none", st.Reconcile.Orphans, st.Reconcile.KeyErrors)
				}
			})
		})
	}
}

// TestIdleLeaseGoesBack: a lease that a key holds when it goes idle goes
// back to Redis within a few rounds, so that other instances can spend it.
func TestIdleLeaseGoesBack(t *testing.T) {
	const burst = 20 // a first lease of 2 tokens: a quarter of a's share
	lim := hybrid.Limit{Rate: slow, Burst: burst}
	inFleet(t, 2, hybrid.Config{}, func(t *testing.T, f *fleet) {
		settle(time.Second) // both instances count the fleet
		a, b := f.lims[0], f.lims[1]
		start := time.Now()
		// a leases a few tokens, spends one and goes idle.
		if res, err := a.Allow(context.Background(), "k", lim); err != nil || !res.Allowed {
			t.Fatalf("a: Allow = %+v, %v, want allowed", res, err)
		}
		settle(5 * interval)
		slack := int64(slow*micro*time.Since(start).Seconds()) + 1
		wantTokens(t, f.m, "k", (burst-1)*micro, slack)
		// b gets every token a did not spend.
		for i := range burst - 1 {
			if res, err := b.Allow(context.Background(), "k", lim); err != nil || !res.Allowed {
				t.Errorf("b: Allow #%d = %+v, %v, want allowed: a spent 1 of %d", i+1, res, err, burst)
			}
		}
	})
}
