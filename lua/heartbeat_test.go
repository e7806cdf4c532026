package lua_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

func TestHeartbeatRejectsArguments(t *testing.T) {
	ok := []string{"a", "5000", "0"}
	with := func(i int, v string) []string {
		a := append([]string(nil), ok...)
		a[i] = v
		return a
	}
	tests := []struct {
		name string
		keys []string
		argv []string
		want string // in the error
	}{
		{"no key", nil, ok, "want 1 to 3 keys"},
		{"four keys", []string{"{f}w", "{f}x", "{f}y", "{f}z"}, ok, "want 1 to 3 keys"},
		{"no args", []string{"f"}, nil, "want 3 arguments"},
		{"two args", []string{"f"}, ok[:2], "want 3 arguments"},
		{"four args", []string{"f"}, append(with(0, "a"), "0"), "want 3 arguments"},
		{"id empty", []string{"f"}, with(0, ""), "id"},
		{"id 257 bytes", []string{"f"}, with(0, strings.Repeat("i", 257)), "id"},
		{"ttl text", []string{"f"}, with(1, "long"), "ttl_ms"},
		{"ttl empty", []string{"f"}, with(1, ""), "ttl_ms"},
		{"ttl zero", []string{"f"}, with(1, "0"), "ttl_ms"},
		{"ttl negative", []string{"f"}, with(1, "-1000"), "ttl_ms"},
		{"ttl fraction", []string{"f"}, with(1, "1.5"), "ttl_ms"},
		{"ttl over 2^40", []string{"f"}, with(1, "1099511627777"), "ttl_ms"},
		{"ttl nan", []string{"f"}, with(1, "nan"), "ttl_ms"},
		{"ttl inf", []string{"f"}, with(1, "inf"), "ttl_ms"},
		{"leave 2", []string{"f"}, with(2, "2"), "leave"},
		{"leave empty", []string{"f"}, with(2, ""), "leave"},
		{"leave text", []string{"f"}, with(2, "yes"), "leave"},
		{"leave 1.0", []string{"f"}, with(2, "1.0"), "leave"},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, tt := range tests {
			args := make([]any, len(tt.argv))
			for i, a := range tt.argv {
				args[i] = a
			}
			keys := tt.keys
			if keys == nil {
				keys = []string{}
			}
			v, err := b.rdb.Eval(ctx, lua.Heartbeat, keys, args...).Result()
			if err == nil || !strings.Contains(err.Error(), "hybrid: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: EVAL = %v, %v; want an error with %q", tt.name, v, err, tt.want)
			}
		}
		n, err := b.rdb.DBSize(ctx).Result()
		if err != nil || n != 0 {
			t.Errorf("DBSIZE after rejected calls = %d, %v; want 0", n, err)
		}
		// The bounds themselves are valid.
		for _, argv := range [][]any{
			{strings.Repeat("i", 256), 1, 0},
			{"i", 1 << 40, 0},
			{"i", 1, 1},
		} {
			if _, err := b.rdb.Eval(ctx, lua.Heartbeat, []string{"f"}, argv...).Result(); err != nil {
				t.Errorf("EVAL(%.10v) = %v, want a reply", argv, err)
			}
		}
	})
}

// beat runs the script once and returns {live, now_ms, was_ms} (reset_ms
// is 0 without KEYS[3]).
func beat(t *testing.T, rdb *redis.Client, key, id string, ttlMS int64, leave int) (live, now, was int64) {
	t.Helper()
	v, err := rdb.Eval(t.Context(), lua.Heartbeat, []string{key}, id, ttlMS, leave).Result()
	if err != nil {
		t.Fatalf("EVAL(%s, %d, %d): %v", id, ttlMS, leave, err)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 4 || a[3] != int64(0) {
		t.Fatalf("EVAL(%s, %d, %d) = %#v, want 3 integers and 0", id, ttlMS, leave, v)
	}
	live, ok1 := a[0].(int64)
	now, ok2 := a[1].(int64)
	was, ok3 := a[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("EVAL(%s, %d, %d) = %#v, want 4 integers", id, ttlMS, leave, v)
	}
	return live, now, was
}

// members returns the members of the sorted set key with their scores, as
// "a=1 b=2" in score order.
func members(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(t.Context(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, z := range zs {
		s = append(s, fmt.Sprintf("%v=%.0f", z.Member, z.Score))
	}
	return strings.Join(s, " ")
}

// TestHeartbeatSteps runs beats and leaves on miniredis with a set clock and
// checks the count, the stored scores and the TTL after each. Members with
// equal scores are listed by name, as Redis sorts them.
func TestHeartbeatSteps(t *testing.T) {
	const ms = time.Millisecond
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	start := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	t0 := start.UnixMilli()
	ms0 := func(d time.Duration) string { return fmt.Sprint(t0 + d.Milliseconds()) }
	steps := []struct {
		at      time.Duration // after start
		id      string
		ttl     int64 // ms
		leave   int
		live    int64
		members string
		pttl    time.Duration // 0: the key is gone
	}{
		{0, "a", 5000, 0, 1, "a=" + ms0(0), 10 * time.Second},
		{1000 * ms, "b", 5000, 0, 2, "a=" + ms0(0) + " b=" + ms0(1000*ms), 10 * time.Second},
		{2000 * ms, "c", 5000, 0, 3, "a=" + ms0(0) + " b=" + ms0(1000*ms) + " c=" + ms0(2000*ms), 10 * time.Second},
		{3000 * ms, "b", 5000, 0, 3, "a=" + ms0(0) + " c=" + ms0(2000*ms) + " b=" + ms0(3000*ms), 10 * time.Second},
		// a beat 4999 ms ago, so a is still live.
		{4999 * ms, "c", 5000, 0, 3, "a=" + ms0(0) + " b=" + ms0(3000*ms) + " c=" + ms0(4999*ms), 10 * time.Second},
		// a beat 5000 ms ago, so a is dead.
		{5000 * ms, "c", 5000, 0, 2, "b=" + ms0(3000*ms) + " c=" + ms0(5000*ms), 10 * time.Second},
		// Redis time counts in whole ms: 5000.99 ms after b's beat is
		// 5000 ms, and b is dead.
		{8000*ms + 990*time.Microsecond, "c", 5000, 0, 1, "c=" + ms0(8000*ms), 10 * time.Second},
		{8000 * ms, "b", 5000, 0, 2, "b=" + ms0(8000*ms) + " c=" + ms0(8000*ms), 10 * time.Second},
		// Leaving removes at once, and a short ttl keeps a TTL of 1 s.
		{8000 * ms, "b", 100, 1, 1, "c=" + ms0(8000*ms), time.Second},
		{8000 * ms, "b", 100, 1, 1, "c=" + ms0(8000*ms), time.Second}, // twice
		{8000 * ms, "c", 1, 1, 0, "", 0},
		{8000 * ms, "c", 1, 1, 0, "", 0}, // from an empty fleet
		{9000 * ms, "d", 600, 0, 1, "d=" + ms0(9000*ms), 1200 * ms},
		// The clock went back: d's beat is ahead of now, so live.
		{7000 * ms, "e", 600, 0, 2, "e=" + ms0(7000*ms) + " d=" + ms0(9000*ms), 1200 * ms},
		{9600 * ms, "e", 600, 0, 1, "e=" + ms0(9600*ms), 1200 * ms},
		// The longest ttl.
		{9600 * ms, "f", 1 << 40, 0, 2, "e=" + ms0(9600*ms) + " f=" + ms0(9600*ms), (2 << 40) * ms},
	}
	for i, s := range steps {
		m.SetTime(start.Add(s.at))
		live, now, was := beat(t, rdb, "fleet", s.id, s.ttl, s.leave)
		if want := start.Add(s.at).UnixMilli(); live != s.live || now != want || was != 0 {
			t.Errorf("step %d: EVAL(t+%v, %s, %d, %d) = {%d, %d, %d}, want {%d, %d, 0}", i, s.at, s.id, s.ttl, s.leave, live, now, was, s.live, want)
		}
		if got := members(t, rdb, "fleet"); got != s.members {
			t.Errorf("step %d: members %q, want %q", i, got, s.members)
		}
		if got := m.TTL("fleet"); got != s.pttl {
			t.Errorf("step %d: TTL %v, want %v", i, got, s.pttl)
		}
		if s.pttl == 0 && m.Exists("fleet") {
			t.Errorf("step %d: the empty fleet's key exists", i)
		}
	}
}

// TestHeartbeatReaps plants members with scores relative to the server's
// own clock and checks which ones a beat removes, on every backend.
func TestHeartbeatReaps(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		const key = "{fleet}"
		const ttl = 60_000
		now := redisNow(ctx, t, b.rdb, key) / 1000
		plant := []redis.Z{
			{Score: float64(now - 10*ttl), Member: "long dead"},
			{Score: float64(now - ttl - 1), Member: "just dead"},
			{Score: float64(now - ttl/2), Member: "live"},
			{Score: float64(now + ttl), Member: "ahead"},
		}
		if err := b.rdb.ZAdd(ctx, key, plant...).Err(); err != nil {
			t.Fatal(err)
		}
		live, got, was := beat(t, b.rdb, key, "me", ttl, 0)
		if live != 3 || got < now || got > now+10_000 || was != 0 {
			t.Errorf("EVAL(me) = {%d, %d}, want {3, about %d}", live, got, now)
		}
		zs, err := b.rdb.ZRange(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Join(zs, ","), "live,me,ahead"; got != want {
			t.Errorf("members %s, want %s", got, want)
		}
		if d := pttl(ctx, t, b, key); d < 2*ttl-1000 || d > 2*ttl {
			t.Errorf("TTL %d ms, want %d", d, 2*ttl)
		}
		if live, _, _ := beat(t, b.rdb, key, "live", ttl, 1); live != 2 {
			t.Errorf("EVAL(leave live) = %d live, want 2", live)
		}
	})
}

// TestHeartbeatWrongType checks that a key holding a string is an error, and
// that the key is left alone.
func TestHeartbeatWrongType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		if err := b.rdb.Set(ctx, "{f}", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, leave := range []int{0, 1} {
			_, err := b.rdb.Eval(ctx, lua.Heartbeat, []string{"{f}"}, "a", 1000, leave).Result()
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Errorf("EVAL(leave %d) on a string = %v, want WRONGTYPE", leave, err)
			}
		}
		if got, err := b.rdb.Get(ctx, "{f}").Result(); got != "v" || err != nil {
			t.Errorf("GET after = %q, %v; want v", got, err)
		}
		if d, err := b.rdb.PTTL(ctx, "{f}").Result(); err != nil || d != -1 {
			t.Errorf("PTTL after = %v, %v; want none", d, err)
		}
	})
}

// TestHeartbeatWitness: with a second key, the script keeps the instance's
// last beat there for at least 10 minutes, returns it as was_ms whatever
// the fleet's reaping did to the instance's member, and deletes it on leave.
func TestHeartbeatWitness(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	keys := []string{"f{x}", "f{x}:a"}
	eval := func(at time.Duration, ttl int64, leave int) (live, now, was int64) {
		t.Helper()
		m.SetTime(start.Add(at))
		v, err := rdb.Eval(t.Context(), lua.Heartbeat, keys, "a", ttl, leave).Result()
		if err != nil {
			t.Fatal(err)
		}
		a := v.([]any)
		return a[0].(int64), a[1].(int64), a[2].(int64)
	}
	if _, _, was := eval(0, 1000, 0); was != 0 {
		t.Errorf("first beat: was %d, want 0", was)
	}
	if got := m.TTL(keys[1]); got != 10*time.Minute {
		t.Errorf("the witness's TTL is %v, want 10m", got)
	}
	// Another instance's beat 5 s later reaps a's member (ttl 1 s), not
	// its witness.
	m.SetTime(start.Add(5 * time.Second))
	if err := rdb.Eval(t.Context(), lua.Heartbeat, []string{"f{x}"}, "b", 1000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, was := eval(6*time.Second, 1000, 0); was != start.UnixMilli() {
		t.Errorf("a beat after a's member was reaped: was %d, want the first beat %d", was, start.UnixMilli())
	}
	if _, _, was := eval(7*time.Second, 1000, 1); was != start.Add(6*time.Second).UnixMilli() {
		t.Errorf("leave: was %d, want the last beat", was)
	}
	if m.Exists(keys[1]) {
		t.Errorf("the witness outlives a leave")
	}
}

// TestHeartbeatResets: with KEYS[3], a beat replies the latest reset of the
// fleet's resets, drops the resets older than 10 minutes, and replies 0
// when none is left.
func TestHeartbeatResets(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		if b.m == nil {
			t.Skip("10 minutes are stepped over on miniredis's clock")
		}
		ctx := t.Context()
		keys := []string{"{f}", "{f}:a", "{f}:resets"}
		reset := func() int64 {
			t.Helper()
			v, err := b.rdb.Eval(ctx, lua.Heartbeat, keys, "a", 3000, 0).Int64Slice()
			if err != nil || len(v) != 4 {
				t.Fatalf("EVAL = %v, %v", v, err)
			}
			return v[3]
		}
		if got := reset(); got != 0 {
			t.Errorf("no reset: %d", got)
		}
		now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		b.m.SetTime(now)
		at := now.Add(-time.Minute).UnixMilli()
		b.rdb.ZAdd(ctx, "{f}:resets", redis.Z{Score: float64(at - 1000), Member: "k1"}, redis.Z{Score: float64(at), Member: "k2"})
		if got := reset(); got != at {
			t.Errorf("the latest reset: %d, want %d", got, at)
		}
		b.m.SetTime(now.Add(10 * time.Minute))
		if got := reset(); got != 0 {
			t.Errorf("resets 11 minutes old: %d, want 0", got)
		}
		if n, _ := b.rdb.ZCard(ctx, "{f}:resets").Result(); n != 0 {
			t.Errorf("%d resets left after 11 minutes, want none", n)
		}
	})
}
