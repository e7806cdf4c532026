package httplimit_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestMaxWait: requests over their limit wait up to MaxWait for their
// tokens and are then served, one a token's time after the other, in the
// order they came; those whose tokens would come later are answered 429 at
// once; a negative MaxWait is refused. One tier and two, every mode.
func TestMaxWait(t *testing.T) {
	if _, err := httplimit.New(nil, httplimit.Config{}); err == nil {
		t.Fatal("New(nil) = nil error")
	}
	for _, tiers := range []int{1, 2} {
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
			t.Run(mode.String()+map[int]string{1: "/one tier", 2: "/two tiers"}[tiers], func(t *testing.T) {
				inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
					limit := hybrid.Limit{Rate: 100, Burst: 1, Mode: mode} // a token every 10 ms
					const each, maxWait = 10 * time.Millisecond, 50 * time.Millisecond
					cfg := httplimit.Config{Limit: limit, MaxWait: maxWait}
					if tiers == 2 {
						cfg = httplimit.Config{MaxWait: maxWait, Checks: func(r *http.Request) ([]hybrid.Check, error) {
							return []hybrid.Check{
								{Tier: "client", Key: "c:" + r.RemoteAddr, Limit: limit},
								{Tier: "all", Key: "all", Limit: hybrid.Limit{Rate: 1000, Burst: 1000, Mode: mode}},
							}, nil
						}}
					}
					if _, err := httplimit.New(lim, httplimit.Config{Limit: limit, MaxWait: -1}); err == nil {
						t.Error("New with a negative MaxWait = nil error")
					}
					mw, h := newMiddleware(t, lim, cfg)
					// 10 requests at once: the first is served, the next
					// five wait their turns (10 to 50 ms), the last four are
					// refused at once.
					start := time.Now()
					var wg sync.WaitGroup
					var served, refused atomic.Int64
					var mu sync.Mutex
					var order []int
					for i := range 10 {
						wg.Go(func() {
							w := serve(h, request("/", "192.0.2.1:1"))
							took := time.Since(start)
							switch w.Code {
							case http.StatusOK:
								served.Add(1)
								mu.Lock()
								order = append(order, i)
								mu.Unlock()
								if took > maxWait {
									t.Errorf("request %d served after %v, more than MaxWait %v", i, took, maxWait)
								}
							case http.StatusTooManyRequests:
								refused.Add(1)
								if tiers == 1 && took != 0 {
									t.Errorf("request %d refused after %v, want at once", i, took)
								}
							default:
								t.Errorf("request %d: %d", i, w.Code)
							}
						})
						if tiers == 1 {
							synctest.Wait() // it has asked: the next comes after it
						}
					}
					wg.Wait()
					if tiers == 1 {
						for i, w := range order {
							if w != i {
								t.Errorf("served in the order %v, want the order they came", order)
								break
							}
						}
					}
					// The burst and a token each 10 ms for 50 ms; with two
					// tiers, whose waiters decide again once the denying
					// tier's RetryAfter has passed, one of those may be
					// missed (an optimistic budget's RetryAfter is its next
					// renewal).
					most := 1 + int64(maxWait/each)
					if got := served.Load(); got > most || got < most-int64(tiers-1) {
						t.Errorf("%d served, %d refused; want %d served", got, refused.Load(), most)
					}
					st := mw.Stats()
					if st.Waited != uint64(served.Load()-1) || st.Allowed != uint64(served.Load()) || st.Denied != uint64(refused.Load()) {
						t.Errorf("Stats = %+v, want %d allowed, %d of them waited, %d denied", st, served.Load(), served.Load()-1, refused.Load())
					}
				})
			})
		}
	}
}
