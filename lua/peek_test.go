package lua_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/lua"
)

// peek runs peek.lua on key and returns its reply.
func peek(ctx context.Context, t *testing.T, rdb *redis.Client, key string, rate, burst int64) (tokens, now int64) {
	t.Helper()
	v, err := rdb.Eval(ctx, lua.Peek, []string{key}, rate, burst).Int64Slice()
	if err != nil || len(v) != 2 {
		t.Fatalf("EVAL peek %q = %v, %v; want 2 integers", key, v, err)
	}
	return v[0], v[1]
}

// rejection is a call a script must refuse: its KEYS and ARGV, and what the
// error says.
type rejection struct {
	name string
	keys []string
	argv []any
	want string // in the error
}

// rejects checks that script refuses each call of tests with an error of
// its own, having written nothing, on every backend.
func rejects(t *testing.T, script string, tests []rejection) {
	t.Helper()
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, tt := range tests {
			v, err := b.rdb.Eval(ctx, script, tt.keys, tt.argv...).Result()
			if err == nil || !strings.Contains(err.Error(), "hybrid: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: EVAL = %v, %v; want an error with %q", tt.name, v, err, tt.want)
			}
		}
		if n, err := b.rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE after rejected calls = %d, %v; want 0", n, err)
		}
	})
}

func TestPeekRejectsArguments(t *testing.T) {
	rejects(t, lua.Peek, []rejection{
		{"no key", []string{}, []any{1, 1}, "want 1 key"},
		{"two keys", []string{"{p}a", "{p}b"}, []any{1, 1}, "want 1 key"},
		{"no args", []string{"p"}, nil, "want 2 arguments (rate, burst)"},
		{"three args", []string{"p"}, []any{1, 1, 1}, "want 2 arguments"},
		{"rate 0", []string{"p"}, []any{0, 1}, "rate 0"},
		{"rate text", []string{"p"}, []any{"fast", 1}, "rate fast"},
		{"burst fraction", []string{"p"}, []any{1, "1.5"}, "burst 1.5"},
		{"burst over 2^50", []string{"p"}, []any{1, "1125899906842625"}, "burst"},
		{"burst nan", []string{"p"}, []any{1, "nan"}, "burst"},
	})
}

// TestPeekReads: a peek reads the bucket as settle.lua's next step finds
// it, in both of its forms, refilled to the same Redis time, and writes
// nothing: a missing key stays missing, and a bucket keeps its value (and
// with it the time it was written) and its TTL.
func TestPeekReads(t *testing.T) {
	const M = 1_000_000
	const rate, burst = 2 * M, 10 * M // 2 tokens/s
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		if tokens, now := peek(ctx, t, b.rdb, "{missing}", rate, burst); tokens != burst || now <= 0 {
			t.Errorf("a missing key: {%d, %d}, want {burst, now}", tokens, now)
		}
		if n, _ := b.rdb.DBSize(ctx).Result(); n != 0 {
			t.Errorf("DBSIZE after peeking at a missing key = %d, want 0", n)
		}
		// A string bucket (a call without a seq) and a hash (with one),
		// each written with 3 tokens 1 s ago: 5 tokens now.
		ago := redisNow(ctx, t, b.rdb, "{s}") - 1_000_000
		if err := b.rdb.Set(ctx, "{s}", fmt.Sprintf("%d %d", 3*M, ago), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.HSet(ctx, "{h}", "t", 3*M, "ts", ago, "q:i1", fmt.Sprintf("1 0 %d", ago)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.Expire(ctx, "{h}", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"{s}", "{h}"} {
			state := func() string {
				if typ, _ := b.rdb.Type(ctx, key).Result(); typ == "hash" {
					h := hash(ctx, t, b.rdb, key)
					return h["t"] + " " + h["ts"]
				}
				v, _ := b.rdb.Get(ctx, key).Result()
				return v
			}
			before, ttl := state(), pttl(ctx, t, b, key)
			tokens, now := peek(ctx, t, b.rdb, key, rate, burst)
			if after := state(); after != before || pttl(ctx, t, b, key) > ttl {
				t.Errorf("%s: a peek wrote the bucket: %q, TTL %d ms, then %q", key, before, ttl, after)
			}
			// The next step, at a Redis time no earlier, finds as much, and
			// no more than it refilled since.
			step := eval(ctx, t, b.rdb, key, rate, burst, 0, 0, 0, 0, M)
			if most := tokens + (step[2]-now)*2 + 1; step[1] < tokens || step[1] > most {
				t.Errorf("%s: peek read %d at %d µs, the next step %d at %d µs", key, tokens, now, step[1], step[2])
			}
			if tokens < 5*M || tokens > 6*M {
				t.Errorf("%s: peek read %d, want about 5 tokens", key, tokens)
			}
		}
	})
}

// TestPeekEdges: a bucket in debt refills from its debt, a full one stays
// at its burst, one written under a larger burst reads as the lower one,
// and whatever settle.lua would replace with a full bucket reads as full.
func TestPeekEdges(t *testing.T) {
	const M = 1_000_000
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		// 10 owed at 1 token/s (the debt is the burst).
		eval(ctx, t, b.rdb, "{debt}", M, 10*M, 20*M, 0, 0, 0, M)
		if tokens, _ := peek(ctx, t, b.rdb, "{debt}", M, 10*M); tokens < -10*M || tokens > -9*M {
			t.Errorf("a bucket 10 tokens in debt: %d", tokens)
		}
		eval(ctx, t, b.rdb, "{big}", M, 100*M, 0, 0, 0, 0, M)
		if tokens, _ := peek(ctx, t, b.rdb, "{big}", M, 10*M); tokens != 10*M {
			t.Errorf("a full bucket of 100 read under a burst of 10: %d", tokens)
		}
		for key, set := range map[string]func() error{
			"{garbled}": func() error { return b.rdb.Set(ctx, "{garbled}", "many", 0).Err() },
			"{list}":    func() error { return b.rdb.RPush(ctx, "{list}", "x").Err() },
			"{hash}":    func() error { return b.rdb.HSet(ctx, "{hash}", "t", "1.5", "ts", "1").Err() },
			"{no ts}":   func() error { return b.rdb.HSet(ctx, "{no ts}", "t", "1").Err() },
		} {
			if err := set(); err != nil {
				t.Fatal(err)
			}
			if tokens, _ := peek(ctx, t, b.rdb, key, M, 10*M); tokens != 10*M {
				t.Errorf("%s: %d, want the burst", key, tokens)
			}
		}
	})
}
