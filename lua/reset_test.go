package lua_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/lua"
)

func TestResetRejectsArguments(t *testing.T) {
	rejects(t, lua.Reset, []rejection{
		{"no key", []string{}, []any{1000, 1000}, "want 1 key"},
		{"two keys", []string{"{r}a", "{r}b"}, []any{1000, 1000}, "want 1 key"},
		{"one arg", []string{"r"}, []any{1000}, "want 2 arguments (grace_ms, keep_ms)"},
		{"grace 0", []string{"r"}, []any{0, 1000}, "grace_ms 0"},
		{"keep text", []string{"r"}, []any{1000, "long"}, "keep_ms long"},
		{"keep over 2^40", []string{"r"}, []any{1000, "1099511627777"}, "keep_ms"},
		{"grace above keep", []string{"r"}, []any{2000, 1000}, "grace_ms 2000 is above keep_ms 1000"},
	})
}

// TestResetSteps: a reset makes a bucket full whatever it held (a string in
// debt, a hash with records), under any limit; while its grace lasts a
// charge takes from the new bucket down to 0 and no further, after it a
// charge sinks it as before; until the mark's keep ends, the charge of an
// outage that began before the reset takes down to 0 only, and the
// bucket's TTL keeps the mark that long; the records go, so that a call
// sent again is applied as new.
func TestResetSteps(t *testing.T) {
	const M = 1_000_000
	const rate, burst = M, 10 * M // 1 token/s
	eachBackend(t, func(t *testing.T, b backend) {
		if b.m == nil {
			t.Skip("the grace's end is stepped over on miniredis's clock")
		}
		ctx := t.Context()
		reset := func(key string, grace, keep time.Duration) int64 {
			t.Helper()
			v, err := b.rdb.Eval(ctx, lua.Reset, []string{key}, grace.Milliseconds(), keep.Milliseconds()).Int64Slice()
			if err != nil || len(v) != 1 {
				t.Fatalf("EVAL reset = %v, %v", v, err)
			}
			return v[0]
		}
		// A bucket 20 tokens in debt, with a record of instance i1.
		v := eval(ctx, t, b.rdb, "{k}", rate, 30*M, 50*M, 0, 0, 0, M, "i1", 1)
		if v[1] != -20*M {
			t.Fatalf("before: %d tokens, want -20", v[1])
		}
		at := reset("{k}", 2*time.Second, time.Minute)
		if tok, _ := peek(ctx, t, b.rdb, "{k}", rate, burst); tok != burst {
			t.Errorf("after the reset: peek %d, want the burst", tok)
		}
		if h := hash(ctx, t, b.rdb, "{k}"); h["q:i1"] != "" {
			t.Errorf("after the reset the record is kept: %v", h)
		}
		// Sent again: applied as new, and charged as the grace charges.
		v = eval(ctx, t, b.rdb, "{k}", rate, burst, 50*M, 0, 0, 0, M, "i1", 1)
		if v[1] != 0 || v[4] != 0 || v[5] != 40*M {
			t.Errorf("a charge of 50 within the grace: {tokens %d, dup %d, forgiven %d}, want {0, 0, 40}", v[1], v[4], v[5])
		}
		if ttl := b.m.TTL("{k}"); ttl < 59*time.Second {
			t.Errorf("TTL %v within the mark's keep, want about a minute", ttl)
		}
		// After the grace (3 s later: 3 tokens refilled): a charge sinks
		// the bucket again, but an outage's from before the reset does not.
		b.m.SetTime(time.UnixMicro(at).Add(3 * time.Second))
		v = eval(ctx, t, b.rdb, "{k}", rate, burst, 5*M, 0, 0, 0, M, "i2", 1, at-1, 0)
		if v[1] != 0 || v[5] != 2*M {
			t.Errorf("an outage's charge from before the reset: {tokens %d, forgiven %d}, want {0, 2}", v[1], v[5])
		}
		v = eval(ctx, t, b.rdb, "{k}", rate, burst, 5*M, 0, 0, 0, M)
		if v[1] != -5*M || v[5] != 0 {
			t.Errorf("a charge after the grace: {tokens %d, forgiven %d}, want {-5, 0}", v[1], v[5])
		}
		// A take ahead keeps the mark, and its TTL.
		if g, _, _ := ahead(ctx, t, b.rdb, "{k}", rate, burst, M, 10*M); g != M {
			t.Errorf("a take ahead after the reset granted %d", g)
		}
		if h := hash(ctx, t, b.rdb, "{k}"); h["z"] == "" {
			t.Errorf("the mark is gone after a take ahead: %v", h)
		}
		if ttl := b.m.TTL("{k}"); ttl < 56*time.Second {
			t.Errorf("TTL %v after a take ahead, want the mark's keep", ttl)
		}
		// A string bucket and a missing key are reset alike.
		eval(ctx, t, b.rdb, "{s}", rate, burst, 15*M, 0, 0, 0, M)
		reset("{s}", time.Second, time.Second)
		reset("{none}", time.Second, time.Second)
		for _, key := range []string{"{s}", "{none}"} {
			if tok, _ := peek(ctx, t, b.rdb, key, rate, burst); tok != burst {
				t.Errorf("%s after a reset: peek %d, want the burst", key, tok)
			}
		}
	})
}
