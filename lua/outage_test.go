package lua_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestSettleOutagePool checks since and claim: the refill a bucket lost at
// its burst while nobody wrote it is a pool that the late charges of an
// outage's admissions draw on, call after call, up to what each claims;
// a bucket written during a call's outage, or a pool of an outage that
// ended before the call's began, credits nothing; a duplicate draws
// nothing again.
func TestSettleOutagePool(t *testing.T) {
	const M = 1_000_000
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		const key = "{pool}"
		now := redisNow(ctx, t, b.rdb, key)
		t0 := now - 20*M // the bucket's last write: empty, 20 s ago
		if err := b.rdb.HSet(ctx, key, "t", "0", "ts", fmt.Sprint(t0), "q:a", fmt.Sprintf("1 0 %d", t0)).Err(); err != nil {
			t.Fatal(err)
		}
		// Refilled for 20 s, the bucket lost 10 at its burst. The first
		// charge of the outage (b's, whose outage began 1 s after the last
		// write) opens the pool and draws 8 of it.
		step(ctx, t, b.rdb, key, "opened, 8 drawn", 15*M, "b", 1, t0+M, 8*M, 3*M, 8*M)
		if p := pool(ctx, t, b.rdb, key); p < 2*M || p > 2*M+M/10 {
			t.Errorf("pool after the first charge = %d, want 2 tokens", p)
		}
		// A duplicate of that call draws nothing again.
		step(ctx, t, b.rdb, key, "duplicate", 15*M, "b", 1, t0+M, 8*M, 3*M, 0)
		// c's outage began before the pool was opened: it draws the rest.
		step(ctx, t, b.rdb, key, "the rest drawn", 5*M, "c", 2, t0+2*M, 4*M, 0, 2*M)
		if n, err := b.rdb.HExists(ctx, key, "o").Result(); err != nil || n {
			t.Errorf("the pool drawn: HEXISTS o = %v, %v; want false", n, err)
		}
		// d's claim finds no pool left: charged in full.
		step(ctx, t, b.rdb, key, "none left", 3*M, "d", 3, t0+2*M, 3*M, -3*M, 0)

		// A bucket written during the call's outage has no pool for it: a
		// partial outage is charged in full.
		const partial = "{partial}"
		now = redisNow(ctx, t, b.rdb, partial)
		if err := b.rdb.HSet(ctx, partial, "t", "0", "ts", fmt.Sprint(now-5*M)).Err(); err != nil {
			t.Fatal(err)
		}
		step(ctx, t, b.rdb, partial, "written during the outage", 8*M, "b", 1, now-20*M, 8*M, 5*M-8*M, 0)

		// A missing key expired once full: the pool is the refill since the
		// outage began less the burst, 5 tokens of 15 s.
		const missing = "{missing}"
		now = redisNow(ctx, t, b.rdb, missing)
		step(ctx, t, b.rdb, missing, "missing", 8*M, "b", 1, now-15*M, 6*M, 10*M-3*M, 5*M)
		// One that expired as the outage began refilled no more than its
		// burst since: nothing lost.
		step(ctx, t, b.rdb, "{missing2}", "missing, no pool", 8*M, "b", 1, now-8*M, 6*M, 10*M-8*M, 0)

		// A pool whose outage ended before the call's began is not the
		// call's, and is dropped.
		const stale = "{stale}"
		now = redisNow(ctx, t, b.rdb, stale)
		if err := b.rdb.HSet(ctx, stale, "t", "0", "ts", fmt.Sprint(now-M), "o", fmt.Sprintf("%d %d", 9*M, now-2*M)).Err(); err != nil {
			t.Fatal(err)
		}
		step(ctx, t, b.rdb, stale, "stale pool", 4*M, "b", 1, now-3*M/2, 4*M, M-4*M, 0)
		if n, err := b.rdb.HExists(ctx, stale, "o").Result(); err != nil || n {
			t.Errorf("a stale pool: HEXISTS o = %v, %v; want false", n, err)
		}
	})
}

// step sends one outage charge of consumed with claim (1 token/s, burst
// 10, a debt of 100) and checks the tokens left and what the reply says
// the pool credited, within what a real clock refills between calls.
func step(ctx context.Context, t *testing.T, rdb *redis.Client, key, name string, consumed int64, instance string, seq, since, claim, tokens, credited int64) {
	t.Helper()
	const M = 1_000_000
	v := eval1(ctx, t, rdb, key, M, 10*M, consumed, 0, 0, 0, 1, 100*M, instance, seq, since, claim)
	if v[1] < tokens || v[1] > tokens+M/10 {
		t.Errorf("%s: tokens %d, want %d", name, v[1], tokens)
	}
	if v[6] < credited || v[6] > credited+M/10 {
		t.Errorf("%s: credited %d, want %d", name, v[6], credited)
	}
}

// pool returns the pool left in key's bucket, 0 if none.
func pool(ctx context.Context, t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	v, err := rdb.HGet(ctx, key, "o").Result()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var p, end int64
	if _, err := fmt.Sscanf(v, "%d %d", &p, &end); err != nil {
		t.Fatalf("pool %q: %v", v, err)
	}
	return p
}
