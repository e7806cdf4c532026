package lua_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/lua"
)

func TestWitnessRejectsArguments(t *testing.T) {
	tests := []struct {
		name string
		keys []string
		argv []any
		want string // in the error
	}{
		{"no key", []string{}, []any{1000}, "want 1 key"},
		{"two keys", []string{"{w}a", "{w}b"}, []any{1000}, "want 1 key"},
		{"no args", []string{"w"}, nil, "want 1 argument"},
		{"two args", []string{"w"}, []any{1000, 1}, "want 1 argument"},
		{"keep text", []string{"w"}, []any{"long"}, "keep_ms"},
		{"keep negative", []string{"w"}, []any{-1}, "keep_ms"},
		{"keep fraction", []string{"w"}, []any{"1.5"}, "keep_ms"},
		{"keep over 2^40", []string{"w"}, []any{"1099511627777"}, "keep_ms"},
		{"keep nan", []string{"w"}, []any{"nan"}, "keep_ms"},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, tt := range tests {
			v, err := b.rdb.Eval(ctx, lua.Witness, tt.keys, tt.argv...).Result()
			if err == nil || !strings.Contains(err.Error(), "hybrid: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: EVAL = %v, %v; want an error with %q", tt.name, v, err, tt.want)
			}
		}
		if n, err := b.rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE after rejected calls = %d, %v; want 0", n, err)
		}
	})
}

// TestWitnessSteps: each call replies the beat before it and keeps its own
// for keep_ms; a beat lost (the key deleted, or garbled) reads as none.
func TestWitnessSteps(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		call := func() (now, was int64) {
			t.Helper()
			v, err := b.rdb.Eval(ctx, lua.Witness, []string{"w"}, 600000).Result()
			a, ok := v.([]any)
			if err != nil || !ok || len(a) != 2 {
				t.Fatalf("EVAL = %#v, %v; want 2 integers", v, err)
			}
			now, ok1 := a[0].(int64)
			was, ok2 := a[1].(int64)
			if !ok1 || !ok2 {
				t.Fatalf("EVAL = %#v; want 2 integers", v)
			}
			return now, was
		}
		now1, was1 := call()
		if was1 != 0 || now1 <= 0 {
			t.Fatalf("first call = {%d, %d}, want {now, 0}", now1, was1)
		}
		if b.m != nil {
			b.m.SetTime(time.UnixMilli(now1).Add(5 * time.Millisecond))
		}
		now2, was2 := call()
		if was2 != now1 || now2 < now1 {
			t.Errorf("second call = {%d, %d}, want {>= %d, %d}", now2, was2, now1, now1)
		}
		if ttl, err := b.rdb.PTTL(ctx, "w").Result(); err != nil || ttl <= 590*time.Second || ttl > 600*time.Second {
			t.Errorf("PTTL = %v, %v; want about 600 s", ttl, err)
		}
		if err := b.rdb.Set(ctx, "w", "garbled", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, was := call(); was != 0 {
			t.Errorf("after a garbled beat: was %d, want 0", was)
		}
		if err := b.rdb.Del(ctx, "w").Err(); err != nil {
			t.Fatal(err)
		}
		if _, was := call(); was != 0 {
			t.Errorf("after the beat was lost: was %d, want 0", was)
		}
		if v, err := b.rdb.Eval(ctx, lua.Witness, []string{"w"}, 0).Result(); err != nil {
			t.Fatalf("EVAL with keep_ms 0 = %v, %v", v, err)
		}
		if n, err := b.rdb.Exists(ctx, "w").Result(); err != nil || n != 0 {
			t.Errorf("EXISTS after keep_ms 0 = %d, %v; want 0", n, err)
		}
	})
}
