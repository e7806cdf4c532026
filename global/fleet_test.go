package global_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestHeartbeat runs beats and leaves of a fleet on miniredis with its clock
// set, and checks the count, the time and the TTL of the set after each.
func TestHeartbeat(t *testing.T) {
	const ms = time.Millisecond
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	steps := []struct {
		at    time.Duration // after t0
		leave bool
		id    string
		ttl   time.Duration
		live  int
		pttl  time.Duration // 0: the set is gone
	}{
		{0, false, "a", 5 * time.Second, 1, 10 * time.Second},
		{1000 * ms, false, "b", 5 * time.Second, 2, 10 * time.Second},
		{2000 * ms, false, "c", 5 * time.Second, 3, 10 * time.Second},
		{2000 * ms, false, "c", 5 * time.Second, 3, 10 * time.Second}, // again
		// a stops beating; b and c go on.
		{3000 * ms, false, "b", 5 * time.Second, 3, 10 * time.Second},
		{4999 * ms, false, "c", 5 * time.Second, 3, 10 * time.Second}, // a heard 4999 ms ago
		{5000 * ms, false, "c", 5 * time.Second, 2, 10 * time.Second}, // 5000 ms ago: gone
		{6000 * ms, false, "a", 5 * time.Second, 3, 10 * time.Second}, // a is back
		// b leaves: gone at once, and twice is no error.
		{6000 * ms, true, "b", 5 * time.Second, 2, 10 * time.Second},
		{6000 * ms, true, "b", 5 * time.Second, 2, 10 * time.Second},
		{6000 * ms, true, "never beat", 5 * time.Second, 2, 10 * time.Second},
		// A short ttl expires the set after 1 s, not 2 * ttl.
		{6000 * ms, false, "c", 400 * ms, 2, time.Second},
		{6500 * ms, false, "c", 400 * ms, 1, time.Second}, // a heard 500 ms ago
		{6500 * ms, true, "c", 400 * ms, 0, 0},
		{6500 * ms, true, "c", 400 * ms, 0, 0}, // from an empty fleet
		// ttl is rounded up to whole ms: 1.5 ms counts as 2 ms.
		{7000 * ms, false, "a", 1500 * time.Microsecond, 1, time.Second},
		{7001 * ms, false, "b", 1500 * time.Microsecond, 2, time.Second},
		{7002 * ms, false, "c", 1500 * time.Microsecond, 2, time.Second},
		// The longest ttl.
		{7002 * ms, false, "d", global.MaxTTL, 3, 2 * global.MaxTTL},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		b.m.SetTime(now)
		var live int
		var err error
		if s.leave {
			live, err = l.Leave(ctx, s.id, s.ttl)
		} else {
			var at time.Time
			live, at, err = l.Heartbeat(ctx, s.id, s.ttl)
			if err == nil && !at.Equal(now) {
				t.Errorf("step %d: Heartbeat(t0+%v, %s, %v) time = %v, want %v", i, s.at, s.id, s.ttl, at, now)
			}
		}
		if err != nil || live != s.live {
			t.Errorf("step %d: leave %v (t0+%v, %s, %v) = %d, %v; want %d", i, s.leave, s.at, s.id, s.ttl, live, err, s.live)
		}
		if got := b.m.TTL(l.FleetKey()); got != s.pttl {
			t.Errorf("step %d: TTL = %v, want %v", i, got, s.pttl)
		}
		if n, err := b.rdb.ZCard(ctx, l.FleetKey()).Result(); err != nil || n != int64(s.live) {
			t.Errorf("step %d: ZCARD = %d, %v; want %d", i, n, err, s.live)
		}
	}
}

// TestHeartbeatBackends counts a fleet on every backend. Real servers run
// their own clock, so a dead instance is planted with a beat far in the past
// of the server's time instead of waiting for it to die.
func TestHeartbeatBackends(t *testing.T) {
	const ttl = time.Minute
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		key := l.FleetKey()
		start := redisNow(ctx, t, b.rdb, key).Truncate(time.Millisecond)
		for i, id := range []string{"a", "b", "c", "b"} {
			live, now, err := l.Heartbeat(ctx, id, ttl)
			if want := min(i+1, 3); err != nil || live != want {
				t.Fatalf("Heartbeat(%s) = %d, %v; want %d", id, live, err, want)
			}
			if now.Before(start) || now.After(start.Add(10*time.Second)) {
				t.Errorf("Heartbeat(%s) time = %v, want about %v", id, now, start)
			}
			if score, err := b.rdb.ZScore(ctx, key, id).Result(); err != nil || int64(score) != now.UnixMilli() {
				t.Errorf("ZSCORE %s = %.0f, %v; want %d", id, score, err, now.UnixMilli())
			}
			if d := b.ttl(ctx, t, key); d > 2*ttl || d < 2*ttl-time.Second {
				t.Errorf("after Heartbeat(%s): TTL = %v, want %v", id, d, 2*ttl)
			}
		}

		// d last beat an hour ago: dead, and dropped by the next beat.
		// e beat half a ttl ago: live.
		now := redisNow(ctx, t, b.rdb, key)
		if err := b.rdb.ZAdd(ctx, key,
			redis.Z{Score: float64(now.Add(-time.Hour).UnixMilli()), Member: "d"},
			redis.Z{Score: float64(now.Add(-ttl / 2).UnixMilli()), Member: "e"},
		).Err(); err != nil {
			t.Fatal(err)
		}
		if live, _, err := l.Heartbeat(ctx, "a", ttl); err != nil || live != 4 {
			t.Errorf("Heartbeat(a) after planting = %d, %v; want 4", live, err)
		}
		// a, b and c may share a ms, and then sort by name.
		got, err := b.rdb.ZRange(ctx, key, 0, -1).Result()
		if err != nil || len(got) != 4 || got[0] != "e" || !slices.Equal(slices.Sorted(slices.Values(got[1:])), []string{"a", "b", "c"}) {
			t.Errorf("ZRANGE = %q, %v; want e then a, b and c", got, err)
		}

		// Leaving drops an instance at once.
		for i, id := range []string{"b", "e", "c", "a"} {
			live, err := l.Leave(ctx, id, ttl)
			if want := 3 - i; err != nil || live != want {
				t.Errorf("Leave(%s) = %d, %v; want %d", id, live, err, want)
			}
			if err := b.rdb.ZScore(ctx, key, id).Err(); !errors.Is(err, redis.Nil) {
				t.Errorf("ZSCORE %s after Leave = %v, want none", id, err)
			}
		}
		if n, err := b.rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS after the last Leave = %d, %v; want 0", n, err)
		}
	})
}

// TestHeartbeatConcurrent beats from many goroutines at once: each one
// counts itself, and none is lost.
func TestHeartbeatConcurrent(t *testing.T) {
	const n = 20
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				id := fmt.Sprintf("instance-%d", i)
				if live, _, err := l.Heartbeat(ctx, id, time.Minute); err != nil || live < 1 || live > n {
					t.Errorf("Heartbeat(%s) = %d, %v; want 1 to %d", id, live, err, n)
				}
			})
		}
		wg.Wait()
		if live, _, err := l.Heartbeat(ctx, "instance-0", time.Minute); err != nil || live != n {
			t.Errorf("Heartbeat after all = %d, %v; want %d", live, err, n)
		}
	})
}

// TestHeartbeatNoScript checks that Heartbeat and Leave send the script
// again when Redis has forgotten it.
func TestHeartbeatNoScript(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		if _, _, err := l.Heartbeat(ctx, "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		b.log.take() // the script may have been cached or not
		steps := []struct {
			flush bool
			leave bool
			id    string
			live  int
			sent  string
		}{
			{false, false, "b", 2, "evalsha=1"},
			{true, false, "c", 3, "evalsha NOSCRIPT=1 eval=1"},
			{false, false, "c", 3, "evalsha=1"},
			{true, true, "c", 2, "evalsha NOSCRIPT=1 eval=1"},
			{false, true, "b", 1, "evalsha=1"},
		}
		for i, s := range steps {
			if s.flush {
				if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var live int
			var err error
			if s.leave {
				live, err = l.Leave(ctx, s.id, time.Minute)
			} else {
				live, _, err = l.Heartbeat(ctx, s.id, time.Minute)
			}
			if err != nil || live != s.live {
				t.Errorf("step %d: leave %v (%s) = %d, %v; want %d", i, s.leave, s.id, live, err, s.live)
			}
			if got := b.log.take(); got != s.sent {
				t.Errorf("step %d: sent %q, want %q", i, got, s.sent)
			}
		}
	})
}

func TestHeartbeatInvalid(t *testing.T) {
	tests := []struct {
		name string
		id   string
		ttl  time.Duration
		want error
	}{
		{"empty id", "", time.Second, global.ErrInvalidKey},
		{"long id", strings.Repeat("i", global.MaxIDLen+1), time.Second, global.ErrInvalidKey},
		{"zero ttl", "a", 0, global.ErrInvalidTTL},
		{"negative ttl", "a", -time.Second, global.ErrInvalidTTL},
		{"ttl below 1ms", "a", time.Millisecond - 1, global.ErrInvalidTTL},
		{"ttl above MaxTTL", "a", global.MaxTTL + 1, global.ErrInvalidTTL},
	}
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	for _, tt := range tests {
		before := b.m.CommandCount()
		live, now, err := l.Heartbeat(ctx, tt.id, tt.ttl)
		if !errors.Is(err, tt.want) || !strings.HasPrefix(fmt.Sprint(err), "global: heartbeat ") || live != 0 || !now.IsZero() {
			t.Errorf("%s: Heartbeat(%.10q, %v) = %d, %v, %v; want global: heartbeat ...: %v", tt.name, tt.id, tt.ttl, live, now, err, tt.want)
		}
		live, err = l.Leave(ctx, tt.id, tt.ttl)
		if !errors.Is(err, tt.want) || !strings.HasPrefix(fmt.Sprint(err), "global: leave ") || live != 0 {
			t.Errorf("%s: Leave(%.10q, %v) = %d, %v; want global: leave ...: %v", tt.name, tt.id, tt.ttl, live, err, tt.want)
		}
		if n := b.m.CommandCount() - before; n != 0 {
			t.Errorf("%s: Redis saw %d commands, want 0", tt.name, n)
		}
	}
	// The bounds themselves are valid.
	for _, c := range []struct {
		id  string
		ttl time.Duration
	}{
		{strings.Repeat("i", global.MaxIDLen), time.Second},
		{"a", time.Millisecond},
		{"b", global.MaxTTL},
		{"\x00{}", time.Second},
	} {
		if _, _, err := l.Heartbeat(ctx, c.id, c.ttl); err != nil {
			t.Errorf("Heartbeat(%.10q, %v) = %v, want nil", c.id, c.ttl, err)
		}
		if _, err := l.Leave(ctx, c.id, c.ttl); err != nil {
			t.Errorf("Leave(%.10q, %v) = %v, want nil", c.id, c.ttl, err)
		}
	}
}

// TestFleetKeyApart checks that the fleet set and the bucket of the user key
// "fleet" are different keys that leave each other alone.
func TestFleetKeyApart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		fleet, bucket := l.FleetKey(), l.Key("fleet")
		if fleet == bucket {
			t.Fatalf("FleetKey() = Key(fleet) = %q", fleet)
		}
		if _, _, err := l.Heartbeat(ctx, "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		replies := make([]global.Reply, 2)
		batch := []global.Settlement{
			{Key: "fleet", Limit: slow, Consumed: M, Want: M, MinGrant: M},
			{Key: "fleet}", Limit: slow, Want: M, MinGrant: M},
		}
		if err := l.Settle(ctx, batch, replies); err != nil || replies[0].Err != nil || replies[1].Err != nil {
			t.Fatalf("Settle(fleet) = %v, %+v", err, replies)
		}
		if r, err := l.Allow(ctx, "fleet", global.Limit{Rate: 1, Burst: 10}, 1); err != nil || !r.Allowed {
			t.Fatalf("Allow(fleet) = %+v, %v", r, err)
		}
		if _, _, err := l.Heartbeat(ctx, "b", time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, k := range []struct{ key, typ string }{{fleet, "zset"}, {bucket, "string"}, {l.Key("fleet}"), "string"}} {
			if got, err := b.rdb.Type(ctx, k.key).Result(); err != nil || got != k.typ {
				t.Errorf("TYPE %s = %q, %v; want %s", k.key, got, err, k.typ)
			}
		}
		if got, err := b.rdb.ZRange(ctx, fleet, 0, -1).Result(); err != nil || strings.Join(got, " ") != "a b" {
			t.Errorf("ZRANGE %s = %q, %v; want [a b]", fleet, got, err)
		}
		if _, _, ok, err := redistest.Bucket(ctx, b.rdb, bucket); err != nil || !ok {
			t.Errorf("bucket %s: %v, %v; want one", bucket, ok, err)
		}
	})
}

// TestHeartbeatWrongType checks that a fleet key someone SET to a string is
// a Redis error, not a garbled reply, and is left alone.
func TestHeartbeatWrongType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		if err := b.rdb.Set(ctx, l.FleetKey(), "not a fleet", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Heartbeat(ctx, "a", time.Second); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") ||
			!strings.HasPrefix(err.Error(), `global: heartbeat "a"`) || errors.Is(err, global.ErrReply) {
			t.Errorf("Heartbeat = %v, want a WRONGTYPE error", err)
		}
		if _, err := l.Leave(ctx, "a", time.Second); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Leave = %v, want a WRONGTYPE error", err)
		}
		if got, err := b.rdb.Get(ctx, l.FleetKey()).Result(); err != nil || got != "not a fleet" {
			t.Errorf("GET = %q, %v; want it unchanged", got, err)
		}
	})
}

// TestHeartbeatCancelled checks that a cancelled context fails both calls.
func TestHeartbeatCancelled(t *testing.T) {
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := l.Heartbeat(ctx, "a", time.Second); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "global: heartbeat ") {
		t.Errorf("Heartbeat(cancelled) = %v, want global: heartbeat ...: %v", err, context.Canceled)
	}
	if _, err := l.Leave(ctx, "a", time.Second); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "global: leave ") {
		t.Errorf("Leave(cancelled) = %v, want global: leave ...: %v", err, context.Canceled)
	}
}
