package global_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// TestPeek: a peek answers what Allow would, from the same bucket at the
// same time, and takes nothing: the decisions after it are those a bucket
// never peeked at makes.
func TestPeek(t *testing.T) {
	const ms = time.Millisecond
	b := newMiniredis(t)
	l := newLimiter(t, b)
	lim := global.Limit{Rate: 5, Burst: 10}
	ctx := t.Context()
	peek := func(at time.Duration, n int64) global.Result {
		t.Helper()
		b.m.SetTime(t0.Add(at))
		res, err := l.Peek(ctx, "user42", lim, n)
		if err != nil {
			t.Fatalf("Peek(t0+%v, %d) = %v", at, n, err)
		}
		if !res.Now.Equal(t0.Add(at)) {
			t.Errorf("Peek(t0+%v, %d).Now = %v", at, n, res.Now)
		}
		res.Now = time.Time{}
		return res
	}
	want := func(allowed bool, remaining int64, retry, reset time.Duration) global.Result {
		return global.Result{Allowed: allowed, Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Limit: lim}
	}
	steps := []struct {
		at   time.Duration
		n    int64
		want global.Result
	}{
		{0, 0, want(true, 10, 0, 0)}, // a missing bucket: full
		{0, 10, want(true, 10, 0, 0)},
	}
	for i, s := range steps {
		if got := peek(s.at, s.n); got != s.want {
			t.Errorf("step %d: Peek(t0+%v, %d) = %+v, want %+v", i, s.at, s.n, got, s.want)
		}
	}
	if n, _ := b.rdb.DBSize(ctx).Result(); n != 0 {
		t.Errorf("DBSIZE after peeks at a missing bucket: %d, want 0", n)
	}
	for range 8 {
		if res, err := l.Allow(ctx, "user42", lim, 1); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
	}
	steps = []struct {
		at   time.Duration
		n    int64
		want global.Result
	}{
		{0, 0, want(true, 2, 0, 1600*ms)},
		{0, 2, want(true, 2, 0, 1600*ms)},
		{0, 3, want(false, 2, 200*ms, 1600*ms)},
		{100 * ms, 3, want(false, 2, 100*ms, 1500*ms)}, // 2.5 tokens
		{100 * ms, 3, want(false, 2, 100*ms, 1500*ms)}, // the same: it took nothing
		{time.Hour, 10, want(true, 10, 0, 0)},
	}
	for i, s := range steps {
		if got := peek(s.at, s.n); got != s.want {
			t.Errorf("step %d: Peek(t0+%v, %d) = %+v, want %+v", i, s.at, s.n, got, s.want)
		}
	}
	// Back at t0+200ms the bucket holds 3: Allow takes them all, as it
	// would had nobody peeked.
	b.m.SetTime(t0.Add(200 * ms))
	if res, err := l.Allow(ctx, "user42", lim, 3); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Errorf("Allow 3 after the peeks = %+v, %v; want allowed, 0 left", res, err)
	}
}

// TestPeekEveryBackend: on a real Redis and a Cluster, a peek reads what
// the last decision left and writes nothing.
func TestPeekEveryBackend(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		lim := global.Limit{Rate: 0.001, Burst: 10} // no refill to speak of
		for _, key := range []string{"a", "b{c}", "d"} {
			if res, err := l.Allow(ctx, key, lim, 4); err != nil || !res.Allowed {
				t.Fatalf("Allow(%q) = %+v, %v", key, res, err)
			}
			before, _ := b.rdb.Get(ctx, l.Key(key)).Result()
			res, err := l.Peek(ctx, key, lim, 7)
			if err != nil || res.Allowed || res.Remaining != 6 || res.RetryAfter < 999*time.Second {
				t.Errorf("Peek(%q, 7) = %+v, %v; want denied, 6 left, 1000 s to wait", key, res, err)
			}
			if after, _ := b.rdb.Get(ctx, l.Key(key)).Result(); after != before {
				t.Errorf("Peek(%q) wrote the bucket: %q, then %q", key, before, after)
			}
		}
	})
}

func TestPeekInvalid(t *testing.T) {
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	lim := global.Limit{Rate: 1, Burst: 10}
	tests := []struct {
		name string
		key  string
		lim  global.Limit
		n    int64
		want error
	}{
		{"empty key", "", lim, 1, global.ErrInvalidKey},
		{"n above the burst", "k", lim, 11, global.ErrInvalidCost},
		{"negative n", "k", lim, -1, global.ErrInvalidCost},
		{"zero rate", "k", global.Limit{Rate: 0, Burst: 10}, 0, global.ErrInvalidLimit},
		{"zero burst", "k", global.Limit{Rate: 1}, 0, global.ErrInvalidLimit},
	}
	for _, tt := range tests {
		if _, err := l.Peek(ctx, tt.key, tt.lim, tt.n); !errors.Is(err, tt.want) {
			t.Errorf("%s: Peek = %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, _, err := l.Tokens(ctx, "k", global.MicroLimit{Rate: 1, Burst: 1}); !errors.Is(err, global.ErrInvalidLimit) {
		t.Errorf("Tokens with a burst below a token = %v, want ErrInvalidLimit", err)
	}
	if n, _ := b.rdb.DBSize(ctx).Result(); n != 0 {
		t.Errorf("DBSIZE after rejected peeks = %d, want 0", n)
	}
}
