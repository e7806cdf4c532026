package policy_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/bubble"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/policy"
)

// TestEnforced: the checks of the example rules, decided by a real Limiter
// on an embedded Redis, enforce the plans: a free user is denied a report
// that a pro user gets, and a report denied by the endpoint's bucket takes
// nothing from the user's buckets, which were checked before it.
func TestEnforced(t *testing.T) {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		t.Fatal(err)
	}
	m := miniredis.RunT(t) // outside the bubble: its goroutines wait on the network
	synctest.Test(t, func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		rdb.AddHook(bubble.Clock{M: m})
		defer rdb.Close()
		lim, err := hybrid.New(rdb, hybrid.Config{Instances: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close(context.Background()) // Close is idempotent
		synctest.Wait()
		time.Sleep(time.Millisecond)
		start := time.Now()
		ctx := context.Background()

		report := func(plan, user string) (hybrid.Decision, []hybrid.Check) {
			t.Helper()
			cs, err := rules.Checks(httptest.NewRequest("GET", "/v1/reports/1", nil), policy.Identity{Plan: plan, User: user})
			if err != nil {
				t.Fatalf("Checks(%s, %s): %v", plan, user, err)
			}
			d, err := lim.AllowAll(ctx, cs...)
			if err != nil {
				t.Fatalf("AllowAll(%s, %s): %v", plan, user, err)
			}
			return d, cs
		}
		// A report costs 10. free: 20 tokens per user, 100 for the
		// endpoint (all free users); pro: 200 per user, 1000 for the
		// endpoint. Nothing refills meanwhile: the bubble's clock stands.
		steps := []struct {
			plan, user string
			deniedBy   string // "" for allowed
		}{
			{"free", "alice", ""},
			{"free", "alice", ""},
			{"free", "alice", "reports"}, // her 20 tokens are spent
			{"pro", "bob", ""},
			{"pro", "bob", ""},
			{"pro", "bob", ""}, // 30 of his 200
			{"free", "u1", ""}, {"free", "u1", ""},
			{"free", "u2", ""}, {"free", "u2", ""},
			{"free", "u3", ""}, {"free", "u3", ""},
			{"free", "u4", ""}, {"free", "u4", ""}, // 10 free reports: the endpoint is empty
			{"pro", "bob", ""}, // pro's endpoint is its own
			{"free", "carol", "reports-endpoint"},
			{"free", "carol", "reports-endpoint"},
		}
		var last hybrid.Decision
		var lastChecks []hybrid.Check
		for i, s := range steps {
			d, cs := report(s.plan, s.user)
			got := ""
			if !d.Allowed {
				got = cs[d.Denied].Tier
			}
			if got != s.deniedBy {
				t.Errorf("step %d: %s user %s: denied by %q, want %q (decision %+v)", i, s.plan, s.user, got, s.deniedBy, d)
			}
			last, lastChecks = d, cs
		}

		// carol's user tiers were decided (and allowed) before the endpoint
		// denied, then given back.
		if got, want := tiers(lastChecks), []string{"per-user", "reports", "reports-endpoint", "plan-pool", "service"}; !slices.Equal(got, want) {
			t.Fatalf("carol's checks %v, want %v", got, want)
		}
		if last.Denied != 2 || len(last.Results) != 3 || !last.Results[0].Allowed || !last.Results[1].Allowed {
			t.Fatalf("carol's decision %+v: want the two user tiers allowed, then the endpoint denying", last)
		}
		for _, c := range []struct {
			check hybrid.Check
			n     int // requests of the check's cost that fit: the whole burst
		}{{lastChecks[0], 30}, {lastChecks[1], 2}} {
			for i := range c.n + 1 {
				res, err := lim.AllowN(ctx, c.check.Key, c.check.Limit, c.check.Cost)
				if err != nil {
					t.Fatal(err)
				}
				if want := i < c.n; res.Allowed != want {
					t.Errorf("%s request %d of cost %d: allowed %v, want %v: carol's bucket did not hold its burst", c.check.Key, i+1, c.check.Cost, res.Allowed, want)
				}
			}
		}

		// Redis was charged what was admitted: 10 reports on free's
		// endpoint, 4 on pro's.
		if err := lim.Close(ctx); err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start).Seconds()
		for _, b := range []struct {
			key    string
			tokens int64
			rate   float64
		}{
			{"free|reports-endpoint|endpoint|GET /v1/reports/{id}", 0, 100.0 / 60},
			{"pro|reports-endpoint|endpoint|GET /v1/reports/{id}", 1000 - 40, 1000.0 / 60},
			{"pro|reports|user|bob", 200 - 40, 100.0 / 60},
			{"free|reports|user|alice", 0, 10.0 / 60},
		} {
			rk := "hybrid:{" + b.key + "}"
			got, _, _, err := redistest.MiniBucket(m, rk)
			if err != nil {
				t.Fatalf("bucket %s: %v", rk, err)
			}
			want, slack := b.tokens*1e6, int64(b.rate*1e6*elapsed)+1
			if got < want || got > want+slack {
				t.Errorf("Redis bucket %q holds %d micro-tokens, want %d (+ at most %d of refill)", rk, got, want, slack)
			}
		}
	})
}
