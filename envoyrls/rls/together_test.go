package rls_test

import (
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// remainingOf returns the limit_remaining of each status of resp.
func remainingOf(resp *rlspb.RateLimitResponse) []uint32 {
	var out []uint32
	for _, s := range resp.GetStatuses() {
		out = append(out, s.GetLimitRemaining())
	}
	return out
}

// codesOf returns the overall code of resp, then each status's.
func codesOf(resp *rlspb.RateLimitResponse) []rlspb.RateLimitResponse_Code {
	out := []rlspb.RateLimitResponse_Code{resp.GetOverallCode()}
	for _, s := range resp.GetStatuses() {
		out = append(out, s.GetCode())
	}
	return out
}

// TestAllOrNothing sends requests of two descriptors, key2 (20 an hour)
// and key3 (10 an hour), until key3 refuses them, then key2 alone. All or
// nothing (the default), the refused requests take nothing from key2,
// which admits 10 more alone; independent (the original's way), each
// refused request still took one of key2's, which admits 5 more. In both
// settlement modes; the statuses' limit_remaining is checked in Exact
// mode (see exactly).
func TestAllOrNothing(t *testing.T) {
	for _, tt := range []struct {
		name        string
		independent bool
		mode        hybrid.Mode
		key2Left    uint32 // after the 15 requests of two
	}{
		{"together/lease", false, hybrid.Lease, 10},
		{"together/exact", false, hybrid.Exact, 10},
		{"independent/lease", true, hybrid.Lease, 5},
		{"independent/exact", true, hybrid.Exact, 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: tt.mode, Independent: tt.independent}))
			for i := range 15 {
				resp := call(t, c, req("another", desc("key2", "u"), desc("key3", "u")))
				wantKey2 := uint32(20 - (i + 1))
				if i >= 10 && !tt.independent {
					wantKey2 = 10
				}
				wantKey3 := uint32(max(10-(i+1), 0))
				code := ok
				if i >= 10 {
					code = over
				}
				if resp.GetOverallCode() != code {
					t.Errorf("request %d: %v, want %v", i, resp.GetOverallCode(), code)
				}
				if got := remainingOf(resp); tt.mode == exactly && (got[0] != wantKey2 || got[1] != wantKey3) {
					t.Errorf("request %d: remaining %v, want [%d %d]", i, got, wantKey2, wantKey3)
				}
			}
			for i := range tt.key2Left + 1 {
				resp := call(t, c, req("another", desc("key2", "u")))
				want := ok
				if i == tt.key2Left {
					want = over
				}
				if resp.GetOverallCode() != want {
					t.Errorf("key2 alone, request %d: %v, want %v", i, resp.GetOverallCode(), want)
				}
			}
		})
	}
}

// TestUndecidedStatus checks the status of a descriptor that the request's
// refusal left undecided: after the refusing one, it is read, not charged,
// and says what its bucket holds.
func TestUndecidedStatus(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly}))
	for range 10 {
		call(t, c, req("another", desc("key3", "spent")))
	}
	call(t, c, req("another", desc("key2", "read")))
	for range 3 {
		resp := call(t, c, req("another", desc("key3", "spent"), desc("key2", "read"), desc("key4", "cold")))
		got := statuses(resp)
		want := []st{
			{code: over, rpu: 10, unit: hour, remaining: 0, reset: 3600},
			{code: ok, rpu: 20, unit: hour, remaining: 19, reset: 180},
			{code: ok, rpu: 20, unit: day, remaining: 20, reset: 0},
		}
		if resp.GetOverallCode() != over || len(got) != 3 || !near(got[0], want[0]) || !near(got[1], want[1]) || got[2] != want[2] {
			t.Errorf("refused request: %v %v, want OVER_LIMIT %v", resp.GetOverallCode(), got, want)
		}
	}
}

// TestShadowMode checks a descriptor in shadow mode: it answers OK and
// counts what it would have refused, and, all or nothing, never makes the
// request refused, takes tokens only of requests that go ahead, and does
// not refuse requests for the others.
func TestShadowMode(t *testing.T) {
	const shadowYAML = `
domain: shadow
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 3}
`
	var counters rls.Counters
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, shadowYAML)), rls.Config{Mode: exactly, Observer: &counters}))
	for i, step := range []struct {
		codes     []rlspb.RateLimitResponse_Code // overall, user, route
		remaining []uint32
	}{
		{[]rlspb.RateLimitResponse_Code{ok, ok, ok}, []uint32{1, 2}},
		{[]rlspb.RateLimitResponse_Code{ok, ok, ok}, []uint32{0, 1}},
		// The shadow limit would refuse: OK, and the route is charged.
		{[]rlspb.RateLimitResponse_Code{ok, ok, ok}, []uint32{0, 0}},
		// The route refuses: the shadow limit is read, not charged.
		{[]rlspb.RateLimitResponse_Code{over, ok, over}, []uint32{0, 0}},
	} {
		resp := call(t, c, req("shadow", desc("user", "a"), desc("route", "r")))
		if got := codesOf(resp); !equal(got, step.codes) {
			t.Errorf("step %d: codes %v, want %v", i, got, step.codes)
		}
		if got := remainingOf(resp); !equal(got, step.remaining) {
			t.Errorf("step %d: remaining %v, want %v", i, got, step.remaining)
		}
	}
	if got, want := counters.Get("shadow.user"), (rls.Hits{Total: 4, WithinLimit: 2, NearLimit: 1, OverLimit: 2, ShadowMode: 2}); got != want {
		t.Errorf("shadow.user stats %+v, want %+v", got, want)
	}
	if got, want := counters.Get("shadow.route"), (rls.Hits{Total: 4, WithinLimit: 3, NearLimit: 1, OverLimit: 1}); got != want {
		t.Errorf("shadow.route stats %+v, want %+v", got, want)
	}
}

// TestGlobalShadowMode checks Config.ShadowMode, the original's SHADOW_MODE:
// the statuses say what was decided, the overall code is OK, and the
// server counts the responses it made OK.
func TestGlobalShadowMode(t *testing.T) {
	srv := newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{ShadowMode: true})
	c := serve(t, srv)
	for i := range 12 {
		resp := call(t, c, req("another", desc("key3", "g")))
		want := []rlspb.RateLimitResponse_Code{ok, ok}
		if i >= 10 {
			want[1] = over
		}
		if got := codesOf(resp); !equal(got, want) {
			t.Errorf("request %d: codes %v, want %v", i, got, want)
		}
	}
	if got := srv.Stats(); got.Requests != 12 || got.GlobalShadowMode != 2 || got.OverLimit != 0 {
		t.Errorf("Stats() = %+v, want 12 requests, 2 made OK by the global shadow mode, none over", got)
	}
}

// TestQuotaMode checks quota-mode descriptors: a request is refused only
// when every one of them is over its limit, as in the original, and
// Config.QuotaMode puts every descriptor in quota mode.
func TestQuotaMode(t *testing.T) {
	const quotaYAML = `
domain: quota
descriptors:
  - key: small
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: large
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, quotaYAML)), rls.Config{}))
	for i, want := range [][]rlspb.RateLimitResponse_Code{
		{ok, ok, ok},
		{ok, over, ok},     // small is over, large is not
		{over, over, over}, // both are
	} {
		if got := codesOf(call(t, c, req("quota", desc("small", "q"), desc("large", "q")))); !equal(got, want) {
			t.Errorf("request %d: codes %v, want %v", i, got, want)
		}
	}

	global := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, quotaYAML)), rls.Config{QuotaMode: true}))
	for i, want := range [][]rlspb.RateLimitResponse_Code{
		{ok, ok, ok},
		{ok, ok, over}, // plain is in quota mode too: large still has one
		{over, over, over},
	} {
		if got := codesOf(call(t, global, req("quota", desc("large", "g"), desc("plain", "g")))); !equal(got, want) {
			t.Errorf("QuotaMode, request %d: codes %v, want %v", i, got, want)
		}
	}
}

// equal reports whether a and b hold the same elements in order.
func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
