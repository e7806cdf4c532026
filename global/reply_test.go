package global

import (
	"errors"
	"testing"
	"time"
)

func TestParseReply(t *testing.T) {
	const (
		burst = 10_000_000
		want  = 1_000_000
		// consumed is what the settlement charged.
		consumed = 2_000_000
		now      = 1_900_000_000_000_000 // µs
	)
	i := func(v int64) any { return v }
	tests := []struct {
		name  string
		v     any
		dedup bool // the call had a seq
		ok    bool
	}{
		{"valid", []any{i(want), i(9_000_000), i(now), i(0), i(0), i(0), i(0)}, false, true},
		{"valid debt", []any{i(0), i(-burst), i(now), i(0), i(0), i(0), i(0)}, false, true},
		{"time 0 (a nil read as an integer)", []any{i(0), i(-burst), i(0), i(0), i(0), i(0), i(0)}, false, false},
		{"valid reset", []any{i(want), i(burst - want), i(now), i(1), i(0), i(0), i(0)}, false, true},
		{"valid with a seq", []any{i(want), i(9_000_000), i(now), i(0), i(0), i(0), i(0)}, true, true},
		{"valid reset with a seq", []any{i(want), i(burst - want), i(now), i(1), i(0), i(0), i(0)}, true, true},
		{"valid duplicate", []any{i(want), i(9_000_000), i(now), i(0), i(1), i(0), i(0)}, true, true},
		{"valid duplicate granted nothing", []any{i(0), i(-burst), i(now), i(0), i(1), i(0), i(0)}, true, true},
		{"valid superseded duplicate", []any{i(0), i(-burst), i(now), i(0), i(2), i(0), i(0)}, true, true},
		{"superseded duplicate granted", []any{i(want), i(9_000_000), i(now), i(0), i(2), i(0), i(0)}, true, false},
		{"dup 3", []any{i(0), i(0), i(now), i(0), i(3), i(0), i(0)}, true, false},
		{"superseded without a seq", []any{i(0), i(0), i(now), i(0), i(2), i(0), i(0)}, false, false},
		{"nil", nil, false, false},
		{"string", "OK", false, false},
		{"integer", i(1), false, false},
		{"empty", []any{}, false, false},
		{"two values", []any{i(0), i(0)}, false, false},
		{"three values", []any{i(0), i(0), i(now)}, false, false},
		{"four values, the old reply", []any{i(0), i(0), i(now), i(0)}, false, false},
		{"four values with a seq", []any{i(0), i(0), i(now), i(0)}, true, false},
		{"eight values", []any{i(0), i(0), i(now), i(0), i(0), i(0), i(0), i(0)}, true, false},
		{"six values, the reply before credited", []any{i(0), i(0), i(now), i(0), i(0), i(0)}, true, false},
		{"five values, the reply before forgiven", []any{i(0), i(0), i(now), i(0), i(0)}, true, false},
		{"nil values", []any{nil, nil, nil, nil, nil, nil, nil}, false, false},
		{"string values", []any{"1", "2", "3", "0", "0", "0", "0"}, false, false},
		{"int, not int64", []any{0, 0, 0, 0, 0, 0, 0}, false, false},
		{"float", []any{i(0), 1.5, i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"nested", []any{[]any{i(0)}, i(0), i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"int64 slice", []int64{0, 0, now, 0, 0, 0, 0}, false, false},
		{"map", map[any]any{"granted": i(0)}, false, false},
		{"negative granted", []any{i(-1), i(0), i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"granted above want", []any{i(want + 1), i(0), i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"duplicate granted above want", []any{i(want + 1), i(0), i(now), i(0), i(1), i(0), i(0)}, true, false},
		{"tokens above burst", []any{i(0), i(burst + 1), i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"debt beyond the burst", []any{i(0), i(-burst - 1), i(now), i(0), i(0), i(0), i(0)}, false, true},
		{"debt of 2^50", []any{i(0), i(-MaxDebt), i(now), i(0), i(0), i(0), i(0)}, false, true},
		{"tokens below -2^50", []any{i(0), i(-MaxDebt - 1), i(now), i(0), i(0), i(0), i(0)}, false, false},
		{"negative now", []any{i(0), i(0), i(-1), i(0), i(0), i(0), i(0)}, false, false},
		{"now beyond 2^53", []any{i(0), i(0), i(1 << 53), i(0), i(0), i(0), i(0)}, false, false},
		{"reset 2", []any{i(0), i(0), i(now), i(2), i(0), i(0), i(0)}, false, false},
		{"reset -1", []any{i(0), i(0), i(now), i(-1), i(0), i(0), i(0)}, false, false},
		{"reset string", []any{i(0), i(0), i(now), "1", i(0), i(0), i(0)}, false, false},
		{"dup -1", []any{i(0), i(0), i(now), i(0), i(-1), i(0), i(0)}, true, false},
		{"dup string", []any{i(0), i(0), i(now), i(0), "1", "0", "0"}, true, false},
		{"dup nil", []any{i(0), i(0), i(now), i(0), nil, nil, nil}, true, false},
		{"dup with reset", []any{i(0), i(burst), i(now), i(1), i(1), i(0), i(0)}, true, false},
		{"dup without a seq", []any{i(want), i(0), i(now), i(0), i(1), i(0), i(0)}, false, false},
		{"forgiven", []any{i(0), i(-burst), i(now), i(0), i(0), i(consumed), i(0)}, false, true},
		{"forgiven above consumed", []any{i(0), i(-burst), i(now), i(0), i(0), i(consumed + 1), i(0)}, false, false},
		{"negative forgiven", []any{i(0), i(0), i(now), i(0), i(0), i(-1), i(0)}, false, false},
		{"forgiven by a duplicate", []any{i(0), i(-burst), i(now), i(0), i(1), i(1), i(0)}, true, false},
		{"credited", []any{i(0), i(0), i(now), i(0), i(0), i(0), i(consumed)}, true, true},
		{"credited and forgiven", []any{i(0), i(-burst), i(now), i(0), i(0), i(500), i(consumed - 500)}, true, true},
		{"credited above consumed", []any{i(0), i(0), i(now), i(0), i(0), i(0), i(consumed + 1)}, true, false},
		{"credited above consumed less forgiven", []any{i(0), i(-burst), i(now), i(0), i(0), i(500), i(consumed - 499)}, true, false},
		{"negative credited", []any{i(0), i(0), i(now), i(0), i(0), i(0), i(-1)}, true, false},
		{"credited by a duplicate", []any{i(0), i(0), i(now), i(0), i(1), i(0), i(1)}, true, false},
		{"error value", []any{errors.New("x"), i(0), i(now), i(0), i(0), i(0), i(0)}, false, false},
	}
	for _, tt := range tests {
		r, err := parseReply(tt.v, burst, want, consumed, tt.dedup)
		if tt.ok {
			if err != nil {
				t.Errorf("%s: parseReply(%v, dedup %v) = %v, want nil", tt.name, tt.v, tt.dedup, err)
			}
			continue
		}
		if !errors.Is(err, ErrReply) {
			t.Errorf("%s: parseReply(%v, dedup %v) = %+v, %v; want %v", tt.name, tt.v, tt.dedup, r, err, ErrReply)
		}
		if r != (Reply{}) {
			t.Errorf("%s: parseReply(%v, dedup %v) = %+v with the error, want a zero Reply", tt.name, tt.v, tt.dedup, r)
		}
	}

	r, err := parseReply([]any{i(want), i(-5), i(now), i(0), i(0), i(0), i(0)}, burst, want, consumed, false)
	if wantR := (Reply{Granted: want, Tokens: -5, Now: time.UnixMicro(now)}); err != nil || r != wantR {
		t.Errorf("parseReply = %+v, %v; want %+v", r, err, wantR)
	}
	r, err = parseReply([]any{i(0), i(burst), i(now), i(1), i(0), i(0), i(0)}, burst, want, consumed, false)
	if wantR := (Reply{Tokens: burst, Now: time.UnixMicro(now), Reset: true}); err != nil || r != wantR {
		t.Errorf("parseReply(reset) = %+v, %v; want %+v", r, err, wantR)
	}
	r, err = parseReply([]any{i(want), i(3), i(now), i(0), i(1), i(0), i(0)}, burst, want, consumed, true)
	if wantR := (Reply{Granted: want, Tokens: 3, Now: time.UnixMicro(now), Duplicate: true}); err != nil || r != wantR {
		t.Errorf("parseReply(dup) = %+v, %v; want %+v", r, err, wantR)
	}
	r, err = parseReply([]any{i(0), i(-burst), i(now), i(0), i(0), i(500), i(700)}, burst, want, consumed, false)
	if wantR := (Reply{Tokens: -burst, Now: time.UnixMicro(now), Forgiven: 500, Credited: 700}); err != nil || r != wantR {
		t.Errorf("parseReply(forgiven, credited) = %+v, %v; want %+v", r, err, wantR)
	}
}

func TestResult(t *testing.T) {
	lim := Limit{Rate: 5, Burst: 10}
	m, err := lim.Micro()
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMicro(1_900_000_000_000_000)
	tests := []struct {
		cost, granted, tokens int64
		want                  Result
	}{
		{1e6, 1e6, 9e6, Result{Allowed: true, Remaining: 9, ResetAfter: 200 * time.Millisecond}},
		{1e6, 1e6, 0, Result{Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second}},
		{1e6, 0, 999_999, Result{Remaining: 0, RetryAfter: 200 * time.Nanosecond, ResetAfter: 1800000200 * time.Nanosecond}},
		{3e6, 0, 2_500_000, Result{Remaining: 2, RetryAfter: 100 * time.Millisecond, ResetAfter: 1500 * time.Millisecond}},
		{1e6, 0, -10e6, Result{Remaining: 0, RetryAfter: 2200 * time.Millisecond, ResetAfter: 4 * time.Second}},
	}
	for _, tt := range tests {
		got := result(Reply{Granted: tt.granted, Tokens: tt.tokens, Now: now}, m, lim, tt.cost)
		tt.want.Limit, tt.want.Now = lim, now
		if got != tt.want {
			t.Errorf("result(cost %d, granted %d, tokens %d) = %+v, want %+v", tt.cost, tt.granted, tt.tokens, got, tt.want)
		}
	}
	if got := result(Reply{Granted: 1e6, Tokens: 9e6, Now: now, Reset: true}, m, lim, 1e6); !got.Reset || !got.Allowed {
		t.Errorf("result of a reset reply = %+v, want Allowed and Reset", got)
	}
}

func TestParseFleetReply(t *testing.T) {
	const now = 1_900_000_000_000 // ms
	tests := []struct {
		name    string
		v       any
		minLive int64
		ok      bool
	}{
		{"valid", []any{int64(3), int64(now), int64(now - 1000), int64(0)}, 1, true},
		{"valid first beat", []any{int64(3), int64(now), int64(0), int64(0)}, 1, true},
		{"valid empty after leave", []any{int64(0), int64(now), int64(0), int64(0)}, 0, true},
		{"valid at time 0", []any{int64(1), int64(0), int64(0), int64(0)}, 1, true},
		{"valid largest", []any{int64(maxLive), int64(maxAmount), int64(maxAmount), int64(0)}, 1, true},
		{"nil", nil, 0, false},
		{"string", "OK", 0, false},
		{"integer", int64(1), 0, false},
		{"empty", []any{}, 0, false},
		{"one value", []any{int64(1)}, 0, false},
		{"three values, the reply before resets", []any{int64(1), int64(now), int64(0)}, 0, false},
		{"five values", []any{int64(1), int64(now), int64(0), int64(0), int64(0)}, 0, false},
		{"nil values", []any{nil, nil, nil, nil}, 0, false},
		{"string values", []any{"1", "2", "3", "4"}, 0, false},
		{"int, not int64", []any{1, now, int64(0), int64(0)}, 0, false},
		{"float", []any{1.5, int64(now), int64(0), int64(0)}, 0, false},
		{"nested", []any{[]any{int64(1)}, int64(now), int64(0), int64(0)}, 0, false},
		{"int64 slice", []int64{1, now, 0, 0}, 0, false},
		{"map", map[any]any{"live": int64(1)}, 0, false},
		{"error value", []any{errors.New("x"), int64(now), int64(0), int64(0)}, 0, false},
		{"beat counts none", []any{int64(0), int64(now), int64(0), int64(0)}, 1, false},
		{"negative live", []any{int64(-1), int64(now), int64(0), int64(0)}, 0, false},
		{"live beyond 2^31", []any{int64(maxLive + 1), int64(now), int64(0), int64(0)}, 0, false},
		{"negative now", []any{int64(1), int64(-1), int64(0), int64(0)}, 0, false},
		{"now beyond 2^53", []any{int64(1), int64(1 << 53), int64(0), int64(0)}, 0, false},
		{"negative last beat", []any{int64(1), int64(now), int64(-1), int64(0)}, 0, false},
		{"last beat beyond 2^53", []any{int64(1), int64(now), int64(1 << 53), int64(0)}, 0, false},
		{"valid with a reset", []any{int64(1), int64(now), int64(0), int64(now - 5000)}, 1, true},
		{"negative reset", []any{int64(1), int64(now), int64(0), int64(-1)}, 0, false},
		{"reset beyond 2^53", []any{int64(1), int64(now), int64(0), int64(1 << 53)}, 0, false},
	}
	for _, tt := range tests {
		b, err := parseFleetReply(tt.v, tt.minLive)
		if tt.ok {
			if err != nil {
				t.Errorf("%s: parseFleetReply(%v, %d) = %v, want nil", tt.name, tt.v, tt.minLive, err)
			}
			continue
		}
		if !errors.Is(err, ErrReply) {
			t.Errorf("%s: parseFleetReply(%v, %d) = %+v, %v; want %v", tt.name, tt.v, tt.minLive, b, err, ErrReply)
		}
		if b != (beatReply{}) {
			t.Errorf("%s: parseFleetReply(%v, %d) = %+v with the error, want the zero reply", tt.name, tt.v, tt.minLive, b)
		}
	}

	b, err := parseFleetReply([]any{int64(7), int64(now), int64(now - 1000), int64(now - 2000)}, 1)
	if err != nil || b.live != 7 || !b.now.Equal(time.UnixMilli(now)) || !b.was.Equal(time.UnixMilli(now-1000)) || !b.reset.Equal(time.UnixMilli(now-2000)) {
		t.Errorf("parseFleetReply = %+v, %v; want 7, %v, %v, %v", b, err, time.UnixMilli(now), time.UnixMilli(now-1000), time.UnixMilli(now-2000))
	}
	if b, err := parseFleetReply([]any{int64(7), int64(now), int64(0), int64(0)}, 1); err != nil || !b.was.IsZero() || !b.reset.IsZero() {
		t.Errorf("parseFleetReply of a first beat, no reset: %+v, %v; want zero times", b, err)
	}
}
