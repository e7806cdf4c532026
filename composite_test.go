package hybrid_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestAllowAll: a request passes only if every tier does, and a tier that
// denies leaves every other tier as it was, locally and in Redis, in every
// mode and in fallback.
func TestAllowAll(t *testing.T) {
	tests := []struct {
		name string
		mode hybrid.Mode
		down bool
	}{
		{"lease", hybrid.Lease, false},
		{"optimistic", hybrid.Optimistic, false},
		{"exact", hybrid.Exact, false},
		{"fallback", hybrid.Lease, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				ctx := context.Background()
				start := time.Now()
				f.setDown(tt.down)
				user := hybrid.Limit{Rate: slow, Burst: 10, Mode: tt.mode}
				endpoint := hybrid.Limit{Rate: slow, Burst: 3, Mode: tt.mode}
				checks := func(cost int64) []hybrid.Check {
					return []hybrid.Check{
						{Tier: "user", Key: "u1", Limit: user, Cost: cost},
						{Tier: "endpoint", Key: "report", Limit: endpoint, Cost: cost},
					}
				}
				step := func(name string, cost int64, want bool, denied int) {
					t.Helper()
					d, err := l.AllowAll(ctx, checks(cost)...)
					if err != nil {
						t.Fatalf("%s: AllowAll: %v", name, err)
					}
					if d.Allowed != want || d.Denied != denied {
						t.Errorf("%s: AllowAll = allowed %v denied %d, want %v, %d", name, d.Allowed, d.Denied, want, denied)
					}
					wantResults := 2
					if denied >= 0 {
						wantResults = denied + 1
					}
					if len(d.Results) != wantResults {
						t.Errorf("%s: %d results, want %d", name, len(d.Results), wantResults)
					}
					if r := d.Result(); r.Allowed != want {
						t.Errorf("%s: Result() = %+v, want allowed %v", name, r, want)
					}
				}
				var back time.Duration
				if tt.mode == hybrid.Exact {
					back = interval // a give-back to Redis lands at the next round
				}
				step("2 of 3 on the endpoint", 2, true, -1)
				step("2 more: the endpoint denies", 2, false, 1)
				settle(back)
				step("1 more fits", 1, true, -1)
				step("the endpoint is empty", 1, false, 1)
				settle(back)
				// The user tier gave back what the endpoint denied: it
				// holds 10-3 = 7 tokens, all of which pass alone.
				for i := range 7 {
					res, err := l.Allow(ctx, "u1", user)
					if err != nil || !res.Allowed {
						t.Fatalf("user token %d of 7: %+v, %v", i+1, res, err)
					}
				}
				if res, _ := l.Allow(ctx, "u1", user); res.Allowed {
					t.Errorf("user token 8 of 7 allowed")
				}
				// Redis is charged what was admitted, once: 10 on the user
				// tier and 3 on the endpoint.
				f.setDown(false)
				settle(2*openTimeout + 3*interval)
				slack := int64(slow*micro*time.Since(start).Seconds()) + 1
				wantTokens(t, f.m, "u1", 0, slack)
				wantTokens(t, f.m, "report", 0, slack)
			})
		})
	}
}

// TestAllowAllFirstDenies: when the first tier denies, the others are not
// even asked.
func TestAllowAllFirstDenies(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		tight := hybrid.Limit{Rate: slow, Burst: 1}
		loose := hybrid.Limit{Rate: slow, Burst: 5}
		if res, err := l.Allow(ctx, "a", tight); err != nil || !res.Allowed {
			t.Fatalf("Allow a: %+v, %v", res, err)
		}
		d, err := l.AllowAll(ctx, hybrid.Check{Key: "a", Limit: tight}, hybrid.Check{Key: "b", Limit: loose})
		if err != nil || d.Allowed || d.Denied != 0 || len(d.Results) != 1 {
			t.Fatalf("AllowAll = %+v, %v; want denied by check 0 with one result", d, err)
		}
		if d.Result().RetryAfter <= 0 {
			t.Errorf("Result().RetryAfter = %v, want > 0", d.Result().RetryAfter)
		}
		settle(3 * interval)
		if f.m.Exists("hybrid:{b}") {
			t.Errorf("tier b was decided although tier a denied first")
		}
	})
}

// TestAllowAllValidation: an invalid check is an error naming its tier, and
// nothing is taken from the valid checks before it.
func TestAllowAllValidation(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		ok := hybrid.Limit{Rate: slow, Burst: 2}
		tests := []struct {
			bad  hybrid.Check
			want error
		}{
			{hybrid.Check{Tier: "t", Key: "", Limit: ok}, hybrid.ErrInvalidKey},
			{hybrid.Check{Tier: "t", Key: strings.Repeat("k", 2000), Limit: ok}, hybrid.ErrInvalidKey},
			{hybrid.Check{Tier: "t", Key: "k", Limit: hybrid.Limit{Rate: -1, Burst: 2}}, hybrid.ErrInvalidLimit},
			{hybrid.Check{Tier: "t", Key: "k", Limit: ok, Cost: 3}, hybrid.ErrInvalidCost},
			{hybrid.Check{Tier: "t", Key: "k", Limit: ok, Cost: -1}, hybrid.ErrInvalidCost},
		}
		for i, tt := range tests {
			_, err := l.AllowAll(ctx, hybrid.Check{Tier: "first", Key: "first", Limit: ok}, tt.bad)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), `tier "t"`) {
				t.Errorf("case %d: AllowAll error %v, want %v naming tier \"t\"", i, err, tt.want)
			}
		}
		// Nothing was taken from "first": both of its tokens are there.
		d, err := l.AllowAll(ctx, hybrid.Check{Key: "first", Limit: ok, Cost: 2})
		if err != nil || !d.Allowed {
			t.Errorf("AllowAll(first, 2) = %+v, %v; want allowed", d, err)
		}
	})
}

// TestAllowAllOneCall: the checks of a composite that need Redis (exact
// ones, and lease ones of keys the instance holds nothing for) go in one
// script call, all or nothing: when the last tier is spent, the others lose
// nothing, and nothing is given back.
func TestAllowAllOneCall(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		exact := hybrid.Limit{Rate: slow, Burst: 5, Mode: hybrid.Exact}
		tight := hybrid.Limit{Rate: slow, Burst: 2, Mode: hybrid.Exact}
		if _, err := l.Allow(ctx, "warm", exact); err != nil { // the script cached
			t.Fatal(err)
		}
		checks := func(user string) []hybrid.Check {
			return []hybrid.Check{
				{Tier: "user", Key: user, Limit: exact},
				{Tier: "cold lease", Key: "lease-" + user, Limit: hybrid.Limit{Rate: slow, Burst: 5}},
				{Tier: "route", Key: "route", Limit: tight},
			}
		}
		for i, user := range []string{"a", "b", "c"} {
			before := f.links[0].commands.Load()
			d, err := l.AllowAll(ctx, checks(user)...)
			if err != nil {
				t.Fatal(err)
			}
			if sent := f.links[0].commands.Load() - before; sent != 1 {
				t.Errorf("composite %d: %d Redis commands, want 1", i, sent)
			}
			want := i < 2 // route holds 2
			if d.Allowed != want || len(d.Results) != 3 {
				t.Fatalf("composite %d: %+v, want allowed %v with 3 results", i, d, want)
			}
			for j, res := range d.Results {
				if res.Source != hybrid.SourceRedis || res.Allowed != (want || j < 2) {
					t.Errorf("composite %d, check %d: %+v", i, j, res)
				}
			}
		}
		// c's tiers lost nothing to route's denial, and nothing came back.
		slack := int64(slow*micro*10) + 1
		wantTokens(t, f.m, "c", 5*micro, slack)
		wantTokens(t, f.m, "lease-c", 5*micro, slack)
		wantTokens(t, f.m, "route", 0, slack)
		if st := l.Stats(); st.Refunds != 0 {
			t.Errorf("Stats.Refunds = %d, want 0: nothing given back", st.Refunds)
		}
	})
}
