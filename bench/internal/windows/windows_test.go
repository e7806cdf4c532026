package windows

import (
	"context"
	"errors"
	"testing"
	"time"
)

// step is a timed request and what it gets.
type step struct {
	at    time.Duration // since epoch
	n     int64
	ok    bool
	count int64
	retry time.Duration
}

// TestSteps walks each script through timed steps on a miniredis whose
// clock the test sets.
func TestSteps(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		alg   Algorithm
		lim   Limit
		steps []step
	}{
		{FixedWindow, Limit{3, time.Second}, []step{
			{0, 1, true, 1, 0},
			{100 * ms, 2, true, 3, 0},
			{200 * ms, 1, false, 3, 800 * ms},
			{999 * ms, 1, false, 3, ms},
			{1000 * ms, 1, true, 1, 0}, // the next window: the key expired
			{1000 * ms, 3, false, 1, 1000 * ms},
			{1500 * ms, 2, true, 3, 0},
			{1999 * ms, 1, false, 3, ms},
			{2000 * ms, 3, true, 3, 0}, // 6 in 501 ms across the boundary
		}},
		{SlidingLog, Limit{3, time.Second}, []step{
			{0, 1, true, 1, 0},
			{100 * ms, 2, true, 3, 0},
			{500 * ms, 1, false, 3, 500 * ms},  // the entry of 0 leaves at 1000
			{999 * ms, 1, false, 3, ms},        // across the fixed boundary: still 3
			{1000 * ms, 1, true, 3, 0},         // (0, 1000] holds the two of 100
			{1050 * ms, 2, false, 3, 50 * ms},  // two must leave: those of 100, at 1100
			{1100 * ms, 2, true, 3, 0},         // the one of 1000 and these two
			{1100 * ms, 1, false, 3, 900 * ms}, // the oldest is of 1000
			{5000 * ms, 3, true, 3, 0},         // expired: empty
		}},
		{SlidingCounter, Limit{10, time.Second}, []step{
			{0, 10, true, 10, 0},
			{500 * ms, 1, false, 10, 500 * ms},  // the current count alone: to the window's end
			{1000 * ms, 1, false, 10, 100 * ms}, // 10 weighs 10, and 9 after 100 ms
			{1100 * ms, 1, true, 10, 0},         // 10 * 0.9 + 1
			{1100 * ms, 1, false, 10, 100 * ms}, // 9 + 2 > 10: weighs 8 at 1200
			{1500 * ms, 4, true, 10, 0},         // 10 * 0.5 + 5
			{2500 * ms, 7, true, 10, 0},         // 5 * 0.5 + 7 = 9.5, rounded up
			{2500 * ms, 1, false, 10, 100 * ms}, // 5 * 0.5 + 8 > 10: 5 * 0.4 + 8 at 2600
			{2900 * ms, 1, true, 9, 0},          // 5 * 0.1 + 8 = 8.5
			{4000 * ms, 10, true, 10, 0},        // two windows on: nothing weighs
		}},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			f := newFakeRedis(t)
			l, err := New(f.rdb, tt.alg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				f.set(s.at)
				got, err := l.Allow(context.Background(), "user42", tt.lim, s.n)
				if err != nil {
					t.Fatalf("step %d: Allow(%v, %d): %v", i, s.at, s.n, err)
				}
				want := Result{Allowed: s.ok, Count: s.count, RetryAfter: s.retry, Now: f.now()}
				if !got.Now.Equal(want.Now) || got.Allowed != want.Allowed || got.Count != want.Count || got.RetryAfter != want.RetryAfter {
					t.Errorf("step %d: Allow(%v, %d) = %+v, want %+v", i, s.at, s.n, got, want)
				}
			}
		})
	}
}

// TestKeysExpire: every script leaves its key with a TTL, and the key is
// gone once nothing in it can count any more.
func TestKeysExpire(t *testing.T) {
	tests := []struct {
		alg  Algorithm
		gone time.Duration // when the key of an admission at 300 ms is gone
	}{
		{FixedWindow, time.Second},            // the window's end
		{SlidingLog, 1300 * time.Millisecond}, // a window after the entry
		{SlidingCounter, 2 * time.Second},     // the next window's end
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			f := newFakeRedis(t)
			l, err := New(f.rdb, tt.alg)
			if err != nil {
				t.Fatal(err)
			}
			f.set(300 * time.Millisecond)
			if _, err := l.Allow(context.Background(), "k", Limit{5, time.Second}, 1); err != nil {
				t.Fatal(err)
			}
			if ttl := f.m.TTL(l.Key("k")); ttl <= 0 {
				t.Fatalf("TTL of %s = %v, want one", l.Key("k"), ttl)
			}
			f.set(tt.gone - time.Millisecond)
			if !f.m.Exists(l.Key("k")) {
				t.Errorf("%s gone at %v, want it until %v", l.Key("k"), f.at, tt.gone)
			}
			f.set(tt.gone)
			if f.m.Exists(l.Key("k")) {
				t.Errorf("%s still there at %v", l.Key("k"), f.at)
			}
		})
	}
}

// TestInvalid: misuse is an error before Redis is touched (the client has
// no server).
func TestInvalid(t *testing.T) {
	f := newFakeRedis(t)
	f.m.Close()
	l, err := New(f.rdb, FixedWindow)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		lim  Limit
		n    int64
		want error
	}{
		{"k", Limit{0, time.Second}, 1, ErrInvalidLimit},
		{"k", Limit{1, 0}, 1, ErrInvalidLimit},
		{"k", Limit{1, 1500 * time.Microsecond}, 1, ErrInvalidLimit},
		{"k", Limit{1 << 50, time.Hour}, 1, ErrInvalidLimit},
		{"k", Limit{3, time.Second}, 0, ErrInvalidCost},
		{"k", Limit{3, time.Second}, 4, ErrInvalidCost},
	}
	for _, tt := range tests {
		if _, err := l.Allow(context.Background(), tt.key, tt.lim, tt.n); !errors.Is(err, tt.want) {
			t.Errorf("Allow(%q, %+v, %d) = %v, want %v", tt.key, tt.lim, tt.n, err, tt.want)
		}
	}
	for _, key := range []string{"", "a{b", "a}"} {
		if _, err := l.Allow(context.Background(), key, Limit{3, time.Second}, 1); err == nil {
			t.Errorf("Allow(%q) = nil error, want one", key)
		}
	}
	if _, err := New(f.rdb, 0); err == nil {
		t.Error("New(rdb, 0) = nil error, want one")
	}
}

// TestParseReply: a reply other than four integers of at least 0 (allowed
// 0 or 1) wraps ErrReply.
func TestParseReply(t *testing.T) {
	bad := []any{
		nil,
		"x",
		[]any{int64(1), int64(2), int64(3)},
		[]any{int64(1), int64(2), int64(3), "4"},
		[]any{int64(2), int64(2), int64(3), int64(4)},
		[]any{int64(1), int64(-2), int64(3), int64(4)},
	}
	for _, v := range bad {
		if _, err := parseReply(v); !errors.Is(err, ErrReply) {
			t.Errorf("parseReply(%v) = %v, want ErrReply", v, err)
		}
	}
	got, err := parseReply([]any{int64(0), int64(7), int64(250), int64(1000)})
	want := Result{Count: 7, RetryAfter: 250 * time.Millisecond, Now: time.UnixMilli(1000)}
	if err != nil || got != want {
		t.Errorf("parseReply = %+v, %v, want %+v", got, err, want)
	}
}
