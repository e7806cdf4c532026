package global_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// TestTakeAhead: takes go into debt as far as they may, all or nothing, and
// the tokens they took are due once the bucket is back at 0; Allow sees the
// debt.
func TestTakeAhead(t *testing.T) {
	const M = 1_000_000
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	lim := global.Limit{Rate: 5, Burst: 10}
	m, err := lim.Micro()
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		at            time.Duration
		cost, debt    int64
		granted, left int64
		due           time.Duration
	}{
		{0, 10 * M, 0, 10 * M, 0, 0},
		{0, M, 0, 0, 0, 0},                                       // would owe 1, may owe none
		{0, 3 * M, 5 * M, 3 * M, -3 * M, 600 * time.Millisecond}, // owes 3: due in 0.6 s
		{0, 3 * M, 5 * M, 0, -3 * M, 600 * time.Millisecond},     // would owe 6
		{200 * time.Millisecond, 3 * M, 5 * M, 3 * M, -5 * M, time.Second},
	}
	for i, s := range steps {
		b.m.SetTime(t0.Add(s.at))
		rep, err := l.TakeAhead(ctx, "k", m, s.cost, s.debt)
		if err != nil {
			t.Fatalf("step %d: TakeAhead = %v", i, err)
		}
		if rep.Granted != s.granted || rep.Tokens != s.left || global.Due(m, rep.Tokens) != s.due || !rep.Now.Equal(t0.Add(s.at)) {
			t.Errorf("step %d: TakeAhead(%d, debt %d) = %+v (due %v), want granted %d, %d left, due %v", i, s.cost, s.debt, rep, global.Due(m, rep.Tokens), s.granted, s.left, s.due)
		}
	}
	b.m.SetTime(t0.Add(time.Second))
	if res, err := l.Allow(ctx, "k", lim, 1); err != nil || res.Allowed || res.RetryAfter != 400*time.Millisecond {
		t.Errorf("Allow with 1 token owed = %+v, %v; want denied for 0.4 s", res, err)
	}
	for _, tt := range []struct {
		name       string
		key        string
		cost, debt int64
		want       error
	}{
		{"empty key", "", M, 0, global.ErrInvalidKey},
		{"cost 0", "k", 0, 0, global.ErrInvalidCost},
		{"cost above burst", "k", 11 * M, 0, global.ErrInvalidCost},
		{"negative debt", "k", M, -1, global.ErrInvalidCost},
		{"debt above 2^50", "k", M, global.MaxDebt + 1, global.ErrInvalidCost},
	} {
		if _, err := l.TakeAhead(ctx, tt.key, m, tt.cost, tt.debt); !errors.Is(err, tt.want) {
			t.Errorf("%s: TakeAhead = %v, want %v", tt.name, err, tt.want)
		}
	}
}
