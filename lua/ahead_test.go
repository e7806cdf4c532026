package lua_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/lua"
)

// ahead runs ahead.lua on key and returns its reply.
func ahead(ctx context.Context, t *testing.T, rdb *redis.Client, key string, rate, burst, cost, debt int64) (granted, tokens, now int64) {
	t.Helper()
	v, err := rdb.Eval(ctx, lua.Ahead, []string{key}, rate, burst, cost, debt).Int64Slice()
	if err != nil || len(v) != 3 {
		t.Fatalf("EVAL ahead %q = %v, %v; want 3 integers", key, v, err)
	}
	return v[0], v[1], v[2]
}

func TestAheadRejectsArguments(t *testing.T) {
	rejects(t, lua.Ahead, []rejection{
		{"no key", []string{}, []any{1, 1, 1, 0}, "want 1 key"},
		{"two keys", []string{"{a}a", "{a}b"}, []any{1, 1, 1, 0}, "want 1 key"},
		{"three args", []string{"a"}, []any{1, 1, 1}, "want 4 arguments (rate, burst, cost, debt)"},
		{"rate 0", []string{"a"}, []any{0, 1, 1, 0}, "rate 0"},
		{"burst text", []string{"a"}, []any{1, "big", 1, 0}, "burst big"},
		{"cost 0", []string{"a"}, []any{1, 1, 0, 0}, "cost 0"},
		{"cost above burst", []string{"a"}, []any{1, 5, 6, 0}, "cost 6 is above burst 5"},
		{"debt negative", []string{"a"}, []any{1, 5, 1, -1}, "debt -1"},
		{"debt over 2^50", []string{"a"}, []any{1, 5, 1, "1125899906842625"}, "debt"},
		{"debt fraction", []string{"a"}, []any{1, 5, 1, "0.5"}, "debt 0.5"},
	})
}

// TestAheadSteps: takes go into debt as far as their debt argument lets
// them, all or nothing; one beyond it takes and writes nothing; the bucket
// refills from its debt as settle.lua refills it, and settle.lua reads what
// ahead.lua wrote, in both forms.
func TestAheadSteps(t *testing.T) {
	const M = 1_000_000
	const rate, burst = M, 2 * M // 1 token/s, burst 2
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		// Against a real clock, the refill between calls: at most 0.1 token.
		near := func(got, want int64) bool { return got >= want && got <= want+M/10 }
		steps := []struct {
			cost, debt      int64
			granted, tokens int64
		}{
			{M, 0, M, M},      // 2 -> 1
			{M, 0, M, 0},      // 1 -> 0
			{M, 0, 0, 0},      // would owe 1, may owe 0: nothing
			{M, 3 * M, M, -M}, // owes 1
			{2 * M, 3 * M, 2 * M, -3 * M},
			{M, 3 * M, 0, -3 * M}, // would owe 4
		}
		for _, key := range []string{"{s}", "{h}"} {
			if key == "{h}" { // a hash with a record, as a numbered call leaves it
				ago := redisNow(ctx, t, b.rdb, key)
				if err := b.rdb.HSet(ctx, key, "t", 2*M, "ts", ago, "q:i1", fmt.Sprintf("7 0 %d", ago)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for i, s := range steps {
				before, _ := b.rdb.Dump(ctx, key).Result()
				granted, tokens, _ := ahead(ctx, t, b.rdb, key, rate, burst, s.cost, s.debt)
				if granted != s.granted || !near(tokens, s.tokens) {
					t.Errorf("%s step %d: ahead(%d, debt %d) = {%d, %d}, want {%d, %d}", key, i, s.cost, s.debt, granted, tokens, s.granted, s.tokens)
				}
				if after, _ := b.rdb.Dump(ctx, key).Result(); granted == 0 && after != before {
					t.Errorf("%s step %d: a take that took nothing wrote the bucket", key, i)
				}
			}
			// Owing 3 at 1 token/s: full again in 5 s.
			if ttl := pttl(ctx, t, b, key); ttl < 4800 || ttl > 5000 {
				t.Errorf("%s: TTL %d ms, want about 5 s, until full", key, ttl)
			}
			if key == "{h}" {
				if h := hash(ctx, t, b.rdb, key); h["q:i1"] == "" {
					t.Errorf("%s: the hash lost its record: %v", key, h)
				}
			}
			if b.m != nil {
				b.m.SetTime(time.UnixMicro(redisNow(ctx, t, b.rdb, key)).Add(2 * time.Second))
			}
			// settle.lua, asking for nothing, reads what ahead.lua left,
			// refilled (2 s on miniredis).
			v := eval(ctx, t, b.rdb, key, rate, burst, 0, 0, 0, 0, M)
			want := int64(-3 * M)
			if b.m != nil {
				want = -M
			}
			if !near(v[1], want) {
				t.Errorf("%s: settle.lua read %d, want %d", key, v[1], want)
			}
		}
		// A missing key is full; so is a garbled one, which becomes a
		// string.
		if g, tok, _ := ahead(ctx, t, b.rdb, "{new}", rate, burst, M, 0); g != M || !near(tok, M) {
			t.Errorf("a missing key: {%d, %d}, want {1, 1} tokens", g, tok)
		}
		if err := b.rdb.RPush(ctx, "{list}", "x").Err(); err != nil {
			t.Fatal(err)
		}
		if g, tok, _ := ahead(ctx, t, b.rdb, "{list}", rate, burst, M, 0); g != M || !near(tok, M) {
			t.Errorf("a list: {%d, %d}, want {1, 1} tokens", g, tok)
		}
		if typ, _ := b.rdb.Type(ctx, "{list}").Result(); typ != "string" {
			t.Errorf("a list taken from is a %s, want a string bucket", typ)
		}
	})
}
