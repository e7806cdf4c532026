package httplimit_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestAppendPolicy: one member per check, in order, the tier's name quoted
// as it is, the burst as q and the fill time in whole seconds as w.
func TestAppendPolicy(t *testing.T) {
	tests := []struct {
		checks []hybrid.Check
		want   string
	}{
		{nil, ""},
		{[]hybrid.Check{{Tier: "per-ip", Limit: hybrid.Limit{Rate: 10, Burst: 20}}}, `"per-ip";q=20;w=2`},
		{[]hybrid.Check{
			{Tier: "user", Limit: hybrid.Limit{Rate: 1, Burst: 10}},
			{Tier: "endpoint", Limit: hybrid.Limit{Rate: 3.0 / 60, Burst: 3}},
		}, `"user";q=10;w=10, "endpoint";q=3;w=60`},
		{[]hybrid.Check{{Tier: `a"b\c` + "\r", Limit: hybrid.Limit{Rate: 1e-6, Burst: 1e9}}}, `"a\"b\\c_";q=1000000000;w=999999999999999`},
		{[]hybrid.Check{{Limit: hybrid.Limit{Rate: 1, Burst: 1}}}, `"";q=1;w=1`},
	}
	for _, tt := range tests {
		prefix := []byte("x: ")
		got := string(httplimit.AppendPolicy(prefix, tt.checks))
		if got != "x: "+tt.want {
			t.Errorf("AppendPolicy(%+v) = %q, want %q", tt.checks, got, "x: "+tt.want)
		}
	}
}

// TestAppendRateLimit: the RateLimit value of allowed and denied decisions,
// built by hand: r and t per tier decided, the denying tier's t its
// Retry-After, and in a denial the earlier tiers' tokens given back and
// their t capped at the Retry-After.
func TestAppendRateLimit(t *testing.T) {
	user := hybrid.Check{Tier: "user", Limit: hybrid.Limit{Rate: 1, Burst: 10}, Cost: 2}
	endpoint := hybrid.Check{Tier: "endpoint", Limit: hybrid.Limit{Rate: 0.1, Burst: 3}}
	checks := []hybrid.Check{user, endpoint}
	tests := []struct {
		name string
		d    hybrid.Decision
		want string
	}{
		{"allowed", hybrid.Decision{Allowed: true, Denied: -1, Results: []hybrid.Result{
			{Allowed: true, Remaining: 8, ResetAfter: 2 * time.Second},
			{Allowed: true, Remaining: 2, ResetAfter: 10 * time.Second},
		}}, `"user";r=8;t=2, "endpoint";r=2;t=10`},
		{"reset a millisecond over a second is 1", hybrid.Decision{Allowed: true, Denied: -1, Results: []hybrid.Result{
			{Allowed: true, Remaining: 9, ResetAfter: time.Second + time.Millisecond},
		}}, `"user";r=9;t=1`},
		{"denied by the first", hybrid.Decision{Denied: 0, Results: []hybrid.Result{
			{Remaining: 1, RetryAfter: 1500 * time.Millisecond, ResetAfter: 9 * time.Second},
		}}, `"user";r=1;t=2`},
		{"denied by the second: the first's tokens are back", hybrid.Decision{Denied: 1, Results: []hybrid.Result{
			{Allowed: true, Remaining: 4, ResetAfter: 6 * time.Second},
			{Remaining: 0, RetryAfter: 3 * time.Second, ResetAfter: 30 * time.Second},
		}}, `"user";r=6;t=3, "endpoint";r=0;t=3`},
		{"given back at most to the burst", hybrid.Decision{Denied: 1, Results: []hybrid.Result{
			{Allowed: true, Remaining: 9, ResetAfter: time.Second},
			{Remaining: 0, RetryAfter: time.Millisecond},
		}}, `"user";r=10;t=1, "endpoint";r=0;t=1`},
		{"more results than checks", hybrid.Decision{Allowed: true, Denied: -1, Results: []hybrid.Result{
			{Allowed: true, Remaining: 8}, {Allowed: true, Remaining: 2}, {Allowed: true, Remaining: 7},
		}}, `"user";r=8;t=0, "endpoint";r=2;t=0`},
		{"no results", hybrid.Decision{Allowed: true, Denied: -1}, ``},
	}
	for _, tt := range tests {
		if got := string(httplimit.AppendRateLimit(nil, checks, tt.d)); got != tt.want {
			t.Errorf("%s: AppendRateLimit = %q, want %q", tt.name, got, tt.want)
		}
	}
}
