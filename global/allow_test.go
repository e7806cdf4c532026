package global_test

// The exact limiter's decisions (Limiter.Allow): the acceptance case, a
// fractional rate, invalid requests, and a burst on every backend.

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
)

// TestAllow is the acceptance case: burst 10, refill 5 tokens/s.
func TestAllow(t *testing.T) {
	const ms = time.Millisecond
	b := newMiniredis(t)
	l := newLimiter(t, b)
	lim := global.Limit{Rate: 5, Burst: 10}
	steps := []struct {
		at        time.Duration // after t0
		n         int64
		allowed   bool
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}{
		{0, 1, true, 9, 0, 200 * ms},
		{0, 1, true, 8, 0, 400 * ms},
		{0, 1, true, 7, 0, 600 * ms},
		{0, 1, true, 6, 0, 800 * ms},
		{0, 1, true, 5, 0, 1000 * ms},
		{0, 1, true, 4, 0, 1200 * ms},
		{0, 1, true, 3, 0, 1400 * ms},
		{0, 1, true, 2, 0, 1600 * ms},
		{0, 1, true, 1, 0, 1800 * ms},
		{0, 1, true, 0, 0, 2000 * ms},
		{0, 1, false, 0, 200 * ms, 2000 * ms}, // the 11th
		{0, 10, false, 0, 2000 * ms, 2000 * ms},
		{1000 * ms, 1, true, 4, 0, 1200 * ms}, // 5 tokens back
		{1000 * ms, 1, true, 3, 0, 1400 * ms},
		{1000 * ms, 1, true, 2, 0, 1600 * ms},
		{1000 * ms, 1, true, 1, 0, 1800 * ms},
		{1000 * ms, 1, true, 0, 0, 2000 * ms},
		{1000 * ms, 1, false, 0, 200 * ms, 2000 * ms}, // the 6th
		{1500 * ms, 3, false, 2, 100 * ms, 1500 * ms}, // 2.5 tokens
		{1550 * ms, 3, false, 2, 50 * ms, 1450 * ms},
		{1600 * ms, 3, true, 0, 0, 2000 * ms}, // 3 tokens
		{1601 * ms, 1, false, 0, 199 * ms, 1999 * ms},
		{time.Hour, 1, true, 9, 0, 200 * ms}, // full again
	}
	ctx := t.Context()
	for i, s := range steps {
		now := t0.Add(s.at)
		b.m.SetTime(now)
		got, err := l.Allow(ctx, "user42", lim, s.n)
		if err != nil {
			t.Fatalf("step %d: Allow(t0+%v, %d) = %v", i, s.at, s.n, err)
		}
		want := global.Result{Allowed: s.allowed, Remaining: s.remaining, RetryAfter: s.retry, ResetAfter: s.reset, Limit: lim, Now: now}
		if !got.Now.Equal(want.Now) {
			t.Errorf("step %d: Allow(t0+%v, %d).Now = %v, want %v", i, s.at, s.n, got.Now, want.Now)
		}
		got.Now = want.Now
		if got != want {
			t.Errorf("step %d: Allow(t0+%v, %d) = %+v, want %+v", i, s.at, s.n, got, want)
		}
	}
}

// TestAllowFractionalRate checks RetryAfter against a rate that does not
// divide a second: 3 tokens/s, 1 token takes 333.333334 ms rounded up.
func TestAllowFractionalRate(t *testing.T) {
	b := newMiniredis(t)
	l := newLimiter(t, b)
	lim := global.Limit{Rate: 3, Burst: 1}
	ctx := t.Context()
	if r, err := l.Allow(ctx, "k", lim, 1); err != nil || !r.Allowed {
		t.Fatalf("first Allow = %+v, %v; want allowed", r, err)
	}
	r, err := l.Allow(ctx, "k", lim, 1)
	if err != nil || r.Allowed || r.RetryAfter != 333333334*time.Nanosecond {
		t.Fatalf("second Allow = %+v, %v; want denied, RetryAfter 333.333334ms", r, err)
	}
	// Redis counts whole microseconds: 333333 µs give 999999 micro-tokens.
	steps := []struct {
		at      time.Duration
		allowed bool
	}{
		{333333 * time.Microsecond, false},
		{333334 * time.Microsecond, true},
	}
	for _, s := range steps {
		b.m.SetTime(t0.Add(s.at))
		r, err := l.Allow(ctx, "k", lim, 1)
		if err != nil || r.Allowed != s.allowed {
			t.Errorf("Allow(t0+%v) = %+v, %v; want allowed %v", s.at, r, err, s.allowed)
		}
	}
}

func TestAllowInvalid(t *testing.T) {
	ok := global.Limit{Rate: 5, Burst: 10}
	tests := []struct {
		name string
		key  string
		lim  global.Limit
		n    int64
		want error
	}{
		{"NaN rate", "k", global.Limit{Rate: math.NaN(), Burst: 10}, 1, global.ErrInvalidLimit},
		{"+Inf rate", "k", global.Limit{Rate: math.Inf(1), Burst: 10}, 1, global.ErrInvalidLimit},
		{"-Inf rate", "k", global.Limit{Rate: math.Inf(-1), Burst: 10}, 1, global.ErrInvalidLimit},
		{"zero rate", "k", global.Limit{Rate: 0, Burst: 10}, 1, global.ErrInvalidLimit},
		{"negative rate", "k", global.Limit{Rate: -1, Burst: 10}, 1, global.ErrInvalidLimit},
		{"rate too high", "k", global.Limit{Rate: 2e9, Burst: 10}, 1, global.ErrInvalidLimit},
		{"zero limit", "k", global.Limit{}, 1, global.ErrInvalidLimit},
		{"zero burst", "k", global.Limit{Rate: 5}, 1, global.ErrInvalidLimit},
		{"negative burst", "k", global.Limit{Rate: 5, Burst: -1}, 1, global.ErrInvalidLimit},
		{"burst too high", "k", global.Limit{Rate: 5, Burst: limit.MaxBurst + 1}, 1, global.ErrInvalidLimit},
		{"zero cost", "k", ok, 0, global.ErrInvalidCost},
		{"negative cost", "k", ok, -1, global.ErrInvalidCost},
		{"cost above burst", "k", ok, 11, global.ErrInvalidCost},
		{"empty key", "", ok, 1, global.ErrInvalidKey},
		{"long key", strings.Repeat("k", limit.MaxKeyLen+1), ok, 1, global.ErrInvalidKey},
	}
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	for _, tt := range tests {
		before := b.m.CommandCount()
		_, err := l.Allow(ctx, tt.key, tt.lim, tt.n)
		if !errors.Is(err, tt.want) || !strings.HasPrefix(fmt.Sprint(err), "global: allow ") {
			t.Errorf("%s: Allow(%.10q, %+v, %d) = %v, want global: allow ...: %v", tt.name, tt.key, tt.lim, tt.n, err, tt.want)
		}
		if n := b.m.CommandCount() - before; n != 0 {
			t.Errorf("%s: Redis saw %d commands, want 0", tt.name, n)
		}
	}
	// The bounds themselves are valid.
	for _, c := range []struct {
		key string
		lim global.Limit
		n   int64
	}{
		{strings.Repeat("k", limit.MaxKeyLen), ok, 10},
		{"k", global.Limit{Rate: limit.MinRate, Burst: limit.MaxBurst}, limit.MaxBurst},
		{"k2", global.Limit{Rate: limit.MaxRate, Burst: 1}, 1},
	} {
		if r, err := l.Allow(ctx, c.key, c.lim, c.n); err != nil || !r.Allowed {
			t.Errorf("Allow(%.10q, %+v, %d) = %+v, %v; want allowed", c.key, c.lim, c.n, r, err)
		}
	}
}

// TestAllowBurst runs the exact limiter on every backend with a rate so low
// that the bucket does not refill during the test.
func TestAllowBurst(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		lim := global.Limit{Rate: limit.MinRate, Burst: 10}
		for i := range 11 {
			r, err := l.Allow(ctx, "user42", lim, 1)
			if err != nil {
				t.Fatalf("Allow %d: %v", i+1, err)
			}
			if i < 10 {
				if !r.Allowed || r.Remaining != int64(9-i) || r.RetryAfter != 0 {
					t.Errorf("Allow %d = %+v, want allowed, remaining %d", i+1, r, 9-i)
				}
				continue
			}
			// 1 token at 1 micro-token/s: 1e6 s, less what has refilled.
			if r.Allowed || r.Remaining != 0 || r.RetryAfter > 1e6*time.Second || r.RetryAfter < 1e6*time.Second-time.Minute {
				t.Errorf("Allow 11 = %+v, want denied, RetryAfter about 1e6 s", r)
			}
			if r.ResetAfter > 1e7*time.Second || r.ResetAfter < 1e7*time.Second-time.Minute {
				t.Errorf("Allow 11: ResetAfter = %v, want about 1e7 s", r.ResetAfter)
			}
		}
	})
}
