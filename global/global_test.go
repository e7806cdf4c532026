package global_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const M = limit.Micro

func TestNew(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		prefix string
		key    string // Key("user42"), or "" for an error
	}{
		{"", "hybrid:{user42}"},
		{"app", "app:{user42}"},
		{"a:b", "a:b:{user42}"},
		{"a{b", ""},
		{"a}b", ""},
		{"{", ""},
	}
	for _, tt := range tests {
		l, err := global.New(rdb, global.Config{Prefix: tt.prefix})
		if tt.key == "" {
			if err == nil || !strings.HasPrefix(err.Error(), "global: ") {
				t.Errorf("New(prefix %q) = %v, want a global: error", tt.prefix, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("New(prefix %q) = %v, want nil", tt.prefix, err)
			continue
		}
		if got := l.Key("user42"); got != tt.key {
			t.Errorf("prefix %q: Key(user42) = %q, want %q", tt.prefix, got, tt.key)
		}
	}
	if _, err := global.New(nil, global.Config{}); err == nil {
		t.Errorf("New(nil) = nil error, want one")
	}
}

func TestKeyInjective(t *testing.T) {
	l, err := global.New(redis.NewClient(&redis.Options{}), global.Config{Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "a}", "}a", "a}b", "a}{b", "{a}", "a:{b}", ":{a", "}", "}}", "{", "\x00", "a b",
		"fleet", "fleet}", "{fleet}", "fleet{fleet}", ":fleet{fleet}", "fleet{fleet", "fleet:{fleet}"}
	seen := map[string]string{}
	for _, k := range keys {
		rk := l.Key(k)
		if prev, ok := seen[rk]; ok {
			t.Errorf("Key(%q) = Key(%q) = %q", k, prev, rk)
		}
		seen[rk] = k
		got, ok := strings.CutPrefix(rk, "p:{")
		if !ok || !strings.HasSuffix(got, "}") || got[:len(got)-1] != k {
			t.Errorf("Key(%q) = %q, want p:{%s}", k, rk, k)
		}
		// What makes a bucket key: its first '{' follows a ':'.
		if i := strings.IndexByte(rk, '{'); i < 1 || rk[i-1] != ':' {
			t.Errorf("Key(%q) = %q: its first '{' does not follow a ':'", k, rk)
		}
	}

	// The fleet set is no bucket: its first '{' follows a 't'. Not of this
	// prefix, nor of one that ends like the fleet key starts.
	if got, want := l.FleetKey(), "p:fleet{fleet}"; got != want {
		t.Errorf("FleetKey() = %q, want %q", got, want)
	}
	if k, ok := seen[l.FleetKey()]; ok {
		t.Errorf("FleetKey() = Key(%q) = %q", k, l.FleetKey())
	}
	if i := strings.IndexByte(l.FleetKey(), '{'); i < 1 || l.FleetKey()[i-1] == ':' {
		t.Errorf("FleetKey() = %q: its first '{' follows a ':'", l.FleetKey())
	}
	for _, prefix := range []string{"p", "p:", "p:fleet", "p:fleet:", "p:fleet:fleet"} {
		other, err := global.New(redis.NewClient(&redis.Options{}), global.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if rk := other.Key(k); rk == l.FleetKey() {
				t.Errorf("prefix %q: Key(%q) = FleetKey() of prefix p = %q", prefix, k, rk)
			}
		}
		if prefix != "p" && other.FleetKey() == l.FleetKey() {
			t.Errorf("prefix %q: FleetKey() = %q, the same as for prefix p", prefix, other.FleetKey())
		}
	}
}

func TestSettleInvalid(t *testing.T) {
	lim := limit.MicroLimit{Rate: 5 * M, Burst: 10 * M}
	tests := []struct {
		name string
		s    global.Settlement
		want error
	}{
		{"empty key", global.Settlement{Limit: lim}, global.ErrInvalidKey},
		{"long key", global.Settlement{Key: strings.Repeat("k", limit.MaxKeyLen+1), Limit: lim}, global.ErrInvalidKey},
		{"zero limit", global.Settlement{Key: "k"}, global.ErrInvalidLimit},
		{"zero rate", global.Settlement{Key: "k", Limit: limit.MicroLimit{Burst: 10 * M}}, global.ErrInvalidLimit},
		{"negative rate", global.Settlement{Key: "k", Limit: limit.MicroLimit{Rate: -1, Burst: 10 * M}}, global.ErrInvalidLimit},
		{"rate too high", global.Settlement{Key: "k", Limit: limit.MicroLimit{Rate: 1e15 + 1, Burst: 10 * M}}, global.ErrInvalidLimit},
		{"burst below a token", global.Settlement{Key: "k", Limit: limit.MicroLimit{Rate: 1, Burst: M - 1}}, global.ErrInvalidLimit},
		{"burst too high", global.Settlement{Key: "k", Limit: limit.MicroLimit{Rate: 1, Burst: limit.MaxBurst*M + 1}}, global.ErrInvalidLimit},
		{"negative consumed", global.Settlement{Key: "k", Limit: lim, Consumed: -1}, global.ErrInvalidCost},
		{"negative returned", global.Settlement{Key: "k", Limit: lim, Returned: -1}, global.ErrInvalidCost},
		{"negative want", global.Settlement{Key: "k", Limit: lim, Want: -1}, global.ErrInvalidCost},
		{"negative min grant", global.Settlement{Key: "k", Limit: lim, MinGrant: -1}, global.ErrInvalidCost},
		{"consumed 2^53", global.Settlement{Key: "k", Limit: lim, Consumed: 1 << 53}, global.ErrInvalidCost},
		{"min grant above want", global.Settlement{Key: "k", Limit: lim, Want: M, MinGrant: 2 * M}, global.ErrInvalidCost},
		{"min grant above burst", global.Settlement{Key: "k", Limit: lim, Want: 20 * M, MinGrant: 11 * M}, global.ErrInvalidCost},
		{"negative quantum", global.Settlement{Key: "k", Limit: lim, Want: M, Quantum: -1}, global.ErrInvalidCost},
		{"quantum above burst", global.Settlement{Key: "k", Limit: lim, Want: 20 * M, Quantum: 10*M + 1}, global.ErrInvalidCost},
		{"negative debt", global.Settlement{Key: "k", Limit: lim, Debt: -1}, global.ErrInvalidCost},
		{"debt above 2^50", global.Settlement{Key: "k", Limit: lim, Debt: global.MaxDebt + 1}, global.ErrInvalidCost},
		{"min grant above want in quanta", global.Settlement{Key: "k", Limit: lim, Want: 5*M + M/2, MinGrant: 5*M + 1, Quantum: M}, global.ErrInvalidCost},
		{"instance missing with a seq", global.Settlement{Key: "k", Limit: lim, Seq: 1}, global.ErrInvalidKey},
		{"instance too long", global.Settlement{Key: "k", Limit: lim, Instance: strings.Repeat("i", global.MaxInstance+1), Seq: 1}, global.ErrInvalidKey},
		{"instance with a space", global.Settlement{Key: "k", Limit: lim, Instance: "a b", Seq: 1}, global.ErrInvalidKey},
		{"instance with a colon", global.Settlement{Key: "k", Limit: lim, Instance: "a:b", Seq: 1}, global.ErrInvalidKey},
		{"instance with a brace", global.Settlement{Key: "k", Limit: lim, Instance: "{a}", Seq: 1}, global.ErrInvalidKey},
		{"instance with a NUL", global.Settlement{Key: "k", Limit: lim, Instance: "a\x00", Seq: 1}, global.ErrInvalidKey},
		{"instance not ASCII", global.Settlement{Key: "k", Limit: lim, Instance: "é", Seq: 1}, global.ErrInvalidKey},
		{"seq negative", global.Settlement{Key: "k", Limit: lim, Instance: "a", Seq: -1}, global.ErrInvalidKey},
		{"seq 2^53", global.Settlement{Key: "k", Limit: lim, Instance: "a", Seq: 1 << 53}, global.ErrInvalidKey},
		{"since without a seq", global.Settlement{Key: "k", Limit: lim, Since: time.Unix(5, 0)}, global.ErrInvalidKey},
		{"since before 1970", global.Settlement{Key: "k", Limit: lim, Instance: "a", Seq: 1, Since: time.Unix(-5, 0)}, global.ErrInvalidKey},
		{"claim above consumed", global.Settlement{Key: "k", Limit: lim, Consumed: M, Claim: M + 1, Instance: "a", Seq: 1, Since: time.Unix(5, 0)}, global.ErrInvalidCost},
		{"claim negative", global.Settlement{Key: "k", Limit: lim, Claim: -1, Instance: "a", Seq: 1, Since: time.Unix(5, 0)}, global.ErrInvalidCost},
		{"claim without since", global.Settlement{Key: "k", Limit: lim, Consumed: M, Claim: M, Instance: "a", Seq: 1}, global.ErrInvalidCost},
	}
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	for _, tt := range tests {
		before := b.m.CommandCount()
		replies := make([]global.Reply, 1)
		if err := l.Settle(ctx, []global.Settlement{tt.s}, replies); err != nil {
			t.Errorf("%s: Settle = %v, want nil", tt.name, err)
		}
		if err := replies[0].Err; !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "global: settle ") {
			t.Errorf("%s: Reply.Err = %v, want global: settle ...: %v", tt.name, err, tt.want)
		}
		if n := b.m.CommandCount() - before; n != 0 {
			t.Errorf("%s: Redis saw %d commands, want 0", tt.name, n)
		}
		for _, field := range []string{"instance", "seq"} {
			if strings.HasPrefix(tt.name, field+" ") && !strings.Contains(fmt.Sprint(replies[0].Err), field+" ") {
				t.Errorf("%s: Reply.Err = %v, want it to name the %s", tt.name, replies[0].Err, field)
			}
		}
	}

	// The bounds of Instance and Seq are valid, and Instance alone (no
	// Seq) is not looked at.
	for _, s := range []global.Settlement{
		{Key: "k", Limit: lim, Instance: strings.Repeat("i", global.MaxInstance), Seq: 1},
		{Key: "k", Limit: lim, Instance: "azAZ09_.-", Seq: 1<<53 - 1},
		{Key: "k", Limit: lim, Instance: "not { valid }"},
	} {
		replies := make([]global.Reply, 1)
		if err := l.Settle(ctx, []global.Settlement{s}, replies); err != nil || replies[0].Err != nil {
			t.Errorf("Settle(instance %q, seq %d) = %v, %v; want nil", s.Instance, s.Seq, err, replies[0].Err)
		}
	}

	// An invalid entry does not stop the others.
	batch := []global.Settlement{
		{Key: "a", Limit: lim, Want: M, MinGrant: M},
		{Key: "", Limit: lim, Want: M},
		{Key: "c", Limit: lim, Want: 2 * M, MinGrant: M},
	}
	replies := make([]global.Reply, 3)
	if err := l.Settle(ctx, batch, replies); err != nil {
		t.Fatalf("Settle(mixed) = %v", err)
	}
	if r := replies[0]; r.Err != nil || r.Granted != M || r.Tokens != 9*M {
		t.Errorf("Settle(mixed)[0] = %+v, want granted %d tokens %d", r, M, 9*M)
	}
	if r := replies[1]; !errors.Is(r.Err, global.ErrInvalidKey) {
		t.Errorf("Settle(mixed)[1].Err = %v, want %v", r.Err, global.ErrInvalidKey)
	}
	if r := replies[2]; r.Err != nil || r.Granted != 2*M || r.Tokens != 8*M {
		t.Errorf("Settle(mixed)[2] = %+v, want granted %d tokens %d", r, 2*M, 8*M)
	}

	// Too few replies is an error before anything is sent.
	before := b.m.CommandCount()
	if err := l.Settle(ctx, batch, replies[:2]); err == nil || !strings.HasPrefix(err.Error(), "global: settle") {
		t.Errorf("Settle(3 settlements, 2 replies) = %v, want an error", err)
	}
	if n := b.m.CommandCount() - before; n != 0 {
		t.Errorf("Settle(3 settlements, 2 replies): Redis saw %d commands, want 0", n)
	}
	if err := l.Settle(ctx, nil, nil); err != nil {
		t.Errorf("Settle(nil) = %v, want nil", err)
	}
}

// settleCase is one Settlement on one bucket prepared in a given state.
type settleCase struct {
	name  string
	lim   limit.MicroLimit
	state *state // nil: the key is missing
	s     global.Settlement

	granted, tokens int64         // at the Redis time the state was written
	forgiven        int64         // likewise, less what the bucket refilled since
	ttl             time.Duration // likewise
	keepTS          bool          // the stored ts stays the state's (clock went back)
}

// state is a stored bucket: t tokens as of age ago (ahead if negative).
type state struct {
	t   string
	age time.Duration
}

func st(t int64, age time.Duration) *state { return &state{t: strconv.FormatInt(t, 10), age: age} }

var (
	slow  = limit.MicroLimit{Rate: 1, Burst: 10 * M} // one micro-token a second: time hardly matters
	five  = limit.MicroLimit{Rate: 5 * M, Burst: 10 * M}
	three = limit.MicroLimit{Rate: 3 * M, Burst: 10 * M}
)

var settleCases = []settleCase{
	{name: "missing key is full", lim: slow, s: global.Settlement{},
		granted: 0, tokens: 10 * M, ttl: time.Second},
	{name: "missing key grants", lim: slow, s: global.Settlement{Want: 3 * M, MinGrant: 1},
		granted: 3 * M, tokens: 7 * M, ttl: 3e9 * time.Millisecond},
	{name: "charge", lim: slow, state: st(10*M, 0), s: global.Settlement{Consumed: 4 * M},
		tokens: 6 * M, ttl: 4e9 * time.Millisecond},
	{name: "return", lim: slow, state: st(2*M, 0), s: global.Settlement{Returned: 3 * M},
		tokens: 5 * M, ttl: 5e9 * time.Millisecond},
	{name: "return capped at burst", lim: slow, state: st(8*M, 0), s: global.Settlement{Returned: 5 * M},
		tokens: 10 * M, ttl: time.Second},
	{name: "debt floored at -burst", lim: slow, state: st(2*M, 0), s: global.Settlement{Consumed: 50 * M},
		tokens: -10 * M, forgiven: 38 * M, ttl: 2e10 * time.Millisecond},
	{name: "debt floored at -Debt", lim: slow, state: st(2*M, 0), s: global.Settlement{Consumed: 50 * M, Debt: 30 * M},
		tokens: -30 * M, forgiven: 18 * M, ttl: 4e10 * time.Millisecond},
	{name: "debt deeper than Debt stays", lim: slow, state: st(-20*M, 0), s: global.Settlement{Consumed: 5 * M},
		tokens: -20 * M, forgiven: 5 * M, ttl: 3e10 * time.Millisecond},
	{name: "return before charge", lim: slow, state: st(9*M, 0), s: global.Settlement{Returned: 5 * M, Consumed: 5 * M},
		tokens: 5 * M, ttl: 5e9 * time.Millisecond},
	{name: "partial grant", lim: slow, state: st(3*M, 0), s: global.Settlement{Want: 5 * M, MinGrant: M},
		granted: 3 * M, tokens: 0, ttl: 1e10 * time.Millisecond},
	{name: "min grant not met", lim: slow, state: st(3*M, 0), s: global.Settlement{Want: 5 * M, MinGrant: 5 * M},
		granted: 0, tokens: 3 * M, ttl: 7e9 * time.Millisecond},
	{name: "min grant met", lim: slow, state: st(5*M, 0), s: global.Settlement{Want: 5 * M, MinGrant: 5 * M},
		granted: 5 * M, tokens: 0, ttl: 1e10 * time.Millisecond},
	{name: "no grant in debt", lim: slow, state: st(-2*M, 0), s: global.Settlement{Want: M},
		granted: 0, tokens: -2 * M, ttl: 12e9 * time.Millisecond},
	{name: "charge then grant", lim: slow, state: st(10*M, 0), s: global.Settlement{Consumed: 3 * M, Want: 4 * M, MinGrant: 1},
		granted: 4 * M, tokens: 3 * M, ttl: 7e9 * time.Millisecond},
	{name: "fractional bucket, no quantum grants the fraction", lim: slow, state: st(5*M/2, 0), s: global.Settlement{Want: 5 * M, MinGrant: M},
		granted: 5 * M / 2, tokens: 0, ttl: 1e10 * time.Millisecond},
	{name: "fractional bucket, whole-token quantum grants the whole part and leaves the fraction in Redis", lim: slow, state: st(5*M/2, 0),
		s:       global.Settlement{Want: 5 * M, MinGrant: M, Quantum: M},
		granted: 2 * M, tokens: M / 2, ttl: 95e8 * time.Millisecond},
	{name: "quantum above what is there grants nothing", lim: slow, state: st(7*M/10, 0), s: global.Settlement{Want: M, Quantum: M},
		granted: 0, tokens: 7 * M / 10, ttl: 93e8 * time.Millisecond},
	{name: "quantum of the burst, min grant at want in quanta", lim: slow, s: global.Settlement{Want: 10*M + M/2, MinGrant: 10 * M, Quantum: 10 * M},
		granted: 10 * M, tokens: 0, ttl: 1e10 * time.Millisecond},
	{name: "refill", lim: five, state: st(0, time.Second), s: global.Settlement{},
		tokens: 5 * M, ttl: time.Second},
	{name: "refill capped at burst", lim: five, state: st(0, 10*time.Second), s: global.Settlement{},
		tokens: 10 * M, ttl: time.Second},
	{name: "refill rounds down", lim: three, state: st(0, 333333*time.Microsecond), s: global.Settlement{},
		tokens: 999999, ttl: 3001 * time.Millisecond},
	{name: "refill pays debt", lim: five, state: st(-10*M, time.Second), s: global.Settlement{},
		tokens: -5 * M, ttl: 3 * time.Second},
	{name: "clock moved back", lim: five, state: st(2*M, -10*time.Second), s: global.Settlement{Want: M, MinGrant: M},
		granted: M, tokens: M, ttl: 1800*time.Millisecond + 10*time.Second, keepTS: true},
	{name: "unreadable state is full", lim: slow, state: &state{t: "abc"}, s: global.Settlement{},
		tokens: 10 * M, ttl: time.Second},
	{name: "tokens above a lowered burst", lim: slow, state: st(25*M, 0), s: global.Settlement{},
		tokens: 10 * M, ttl: time.Second},
}

// TestSettle runs the settlement semantics on every backend. On miniredis
// the clock stands still and every value is exact; on a real server time
// passes between writing the state and settling, and the checks allow for
// what that time refills.
func TestSettle(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		for _, c := range settleCases {
			key := c.name
			rkey := l.Key(key)
			var written time.Time // Redis time of the state
			if c.state != nil {
				written = redisNow(ctx, t, b.rdb, rkey)
				ts := written.Add(-c.state.age).UnixMicro()
				if err := b.rdb.Set(ctx, rkey, fmt.Sprint(c.state.t, " ", ts), 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			s := c.s
			s.Key, s.Limit = key, c.lim
			replies := make([]global.Reply, 1)
			if err := l.Settle(ctx, []global.Settlement{s}, replies); err != nil {
				t.Fatalf("%s: Settle = %v", c.name, err)
			}
			r := replies[0]
			if r.Err != nil {
				t.Errorf("%s: Reply.Err = %v", c.name, r.Err)
				continue
			}
			// What the time between writing and settling may have added.
			var slack int64
			if c.state != nil && r.Now.After(written) {
				d := r.Now.Sub(written).Microseconds()
				slack = (d*c.lim.Rate + M - 1) / M
			}
			if r.Granted < c.granted || r.Granted > c.granted+slack ||
				r.Tokens < c.tokens || r.Tokens > c.tokens+slack {
				t.Errorf("%s: Settle(%+v) = granted %d tokens %d, want %d %d (+%d)", c.name, c.s, r.Granted, r.Tokens, c.granted, c.tokens, slack)
			}
			if r.Forgiven > c.forgiven || r.Forgiven < c.forgiven-slack {
				t.Errorf("%s: Settle(%+v) = forgiven %d, want %d (-%d)", c.name, c.s, r.Forgiven, c.forgiven, slack)
			}
			ttl := b.ttl(ctx, t, rkey)
			lo := c.ttl
			if b.m == nil {
				lo -= time.Second
			}
			if ttl < lo || ttl > c.ttl {
				t.Errorf("%s: TTL = %v, want %v", c.name, ttl, c.ttl)
			}
			st, sts, _, err := redistest.Bucket(ctx, b.rdb, rkey)
			if err != nil {
				t.Fatal(err)
			}
			wantTS := r.Now.UnixMicro()
			if c.keepTS {
				wantTS = written.Add(-c.state.age).UnixMicro()
			}
			if st != r.Tokens || sts != wantTS {
				t.Errorf("%s: stored t, ts = %d %d, want %d %d", c.name, st, sts, r.Tokens, wantTS)
			}
		}
	})
}

// TestSettleSameKey checks that settlements of one key in one batch apply in
// order.
func TestSettleSameKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		l := newLimiter(t, b)
		batch := []global.Settlement{
			{Key: "k", Limit: slow, Want: 4 * M, MinGrant: 4 * M},
			{Key: "k", Limit: slow, Want: 4 * M, MinGrant: 4 * M},
			{Key: "k", Limit: slow, Want: 4 * M, MinGrant: 4 * M},
			{Key: "k", Limit: slow, Returned: 4 * M, Want: 3 * M, MinGrant: 1},
		}
		replies := make([]global.Reply, len(batch))
		if err := l.Settle(t.Context(), batch, replies); err != nil {
			t.Fatal(err)
		}
		want := [][2]int64{{4 * M, 6 * M}, {4 * M, 2 * M}, {0, 2 * M}, {3 * M, 3 * M}}
		for i, r := range replies {
			if r.Err != nil || r.Granted != want[i][0] || !about(r.Tokens, want[i][1]) {
				t.Errorf("reply %d = %+v, want granted %d tokens %d", i, r, want[i][0], want[i][1])
			}
		}
	})
}

// TestSettleWrongType checks that a key someone SET to a string is replaced
// by a full bucket, alone, and that the reply says so: neither the key nor
// the others fail, and the key is a bucket again afterwards.
func TestSettleWrongType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		if err := b.rdb.Set(ctx, l.Key("b"), "not a bucket", 0).Err(); err != nil {
			t.Fatal(err)
		}
		batch := []global.Settlement{
			{Key: "a", Limit: slow, Want: M, MinGrant: M},
			{Key: "b", Limit: slow, Consumed: 2 * M, Want: M, MinGrant: M},
			{Key: "c", Limit: slow, Want: M, MinGrant: M},
		}
		replies := make([]global.Reply, 3)
		if err := l.Settle(ctx, batch, replies); err != nil {
			t.Fatalf("Settle = %v, want nil", err)
		}
		for i, r := range replies {
			wantTokens, wantReset := int64(9*M), i == 1
			if wantReset {
				wantTokens = 7 * M // a full bucket, charged 2 and granted 1
			}
			if r.Err != nil || r.Granted != M || !about(r.Tokens, wantTokens) || r.Reset != wantReset {
				t.Errorf("reply %s = %+v, want granted %d tokens %d reset %v", batch[i].Key, r, M, wantTokens, wantReset)
			}
		}
		if tokens, _, ok, err := redistest.Bucket(ctx, b.rdb, l.Key("b")); err != nil || !ok || !about(tokens, 7*M) {
			t.Errorf("bucket b = %d, %v, %v; want %d: the string replaced by a bucket", tokens, ok, err, 7*M)
		}
		if err := l.Settle(ctx, batch[1:2], replies); err != nil || replies[0].Err != nil || replies[0].Reset || !about(replies[0].Tokens, 4*M) {
			t.Errorf("Settle(b) again = %v, %+v; want tokens %d and no reset", err, replies[0], 4*M)
		}

		// The exact limiter too.
		if err := b.rdb.Set(ctx, l.Key("b"), "not a bucket", 0).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := l.Allow(ctx, "b", global.Limit{Rate: 1, Burst: 1}, 1)
		if err != nil || !r.Allowed || !r.Reset {
			t.Errorf("Allow(b) on a string = %+v, %v; want allowed on a full bucket, Reset", r, err)
		}
		r, err = l.Allow(ctx, "b", global.Limit{Rate: 1, Burst: 1}, 1)
		if err != nil || r.Allowed || r.Reset {
			t.Errorf("Allow(b) again = %+v, %v; want denied, no reset", r, err)
		}
	})
}

// TestNoScript checks that both paths recover when Redis has forgotten the
// script: Settle retries the NOSCRIPT replies of its pipeline with EVAL, and
// Allow falls back to EVAL.
func TestNoScript(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		batch := []global.Settlement{
			{Key: "a", Limit: slow, Want: M, MinGrant: M},
			{Key: "b", Limit: slow, Want: M, MinGrant: M},
			{Key: "c", Limit: slow, Want: M, MinGrant: M},
		}
		replies := make([]global.Reply, 3)
		settle := func(round int, wantLog string) {
			t.Helper()
			if err := l.Settle(ctx, batch, replies); err != nil {
				t.Fatalf("round %d: Settle = %v", round, err)
			}
			for i, r := range replies {
				if tokens := (9 - int64(round)) * M; r.Err != nil || r.Granted != M || !about(r.Tokens, tokens) {
					t.Errorf("round %d: reply %d = %+v, want granted %d tokens %d", round, i, r, M, tokens)
				}
			}
			if got := b.log.take(); wantLog != "" && got != wantLog {
				t.Errorf("round %d: sent %q, want %q", round, got, wantLog)
			}
		}
		// One call carries the three keys; on a Cluster, a call each.
		n := 1
		if l.Spread() {
			n = 3
		}
		settle(0, "") // the script may be cached or not
		settle(1, fmt.Sprintf("evalsha=%d", n))
		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		settle(2, fmt.Sprintf("evalsha NOSCRIPT=%d eval=%d", n, n))
		settle(3, fmt.Sprintf("evalsha=%d", n))

		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		lim := global.Limit{Rate: limit.MinRate, Burst: 10}
		for i, want := range []string{"evalsha NOSCRIPT=1 eval=1", "evalsha=1"} {
			if r, err := l.Allow(ctx, "d", lim, 1); err != nil || !r.Allowed {
				t.Errorf("Allow %d after SCRIPT FLUSH = %+v, %v; want allowed", i, r, err)
			}
			if got := b.log.take(); got != want {
				t.Errorf("Allow %d after SCRIPT FLUSH sent %q, want %q", i, got, want)
			}
		}
	})
}

// TestSettleFirstHash: a Limiter's first Settle sends the script's hash, not
// its source, and the source only to a Redis that answers NOSCRIPT; a second
// Limiter's first call, to a Redis that ran the script, sends the hash alone
// (a fleet's instances do not each send the 34 KB source when they start).
func TestSettleFirstHash(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l := newLimiter(t, b)
		settle, n := sentBy(t, l, b)
		settle("first", fmt.Sprintf("evalsha NOSCRIPT=%d eval=%d", n, n))
		settle("second", fmt.Sprintf("evalsha=%d", n))
		settle, _ = sentBy(t, newLimiter(t, b), b)
		settle("another's first", fmt.Sprintf("evalsha=%d", n))
	})
}

// sentBy returns a function that settles two keys with l and checks that
// both are granted and that l sent want (as b's log counts the commands),
// and the number of calls a Settle of them makes: one, or on a Cluster one
// a key.
func sentBy(t *testing.T, l *global.Limiter, b backend) (settle func(what, want string), n int) {
	batch := []global.Settlement{
		{Key: "a", Limit: slow, Want: M, MinGrant: M},
		{Key: "b", Limit: slow, Want: M, MinGrant: M},
	}
	replies := make([]global.Reply, len(batch))
	n = 1
	if l.Spread() {
		n = len(batch)
	}
	b.log.take()
	return func(what, want string) {
		t.Helper()
		if err := l.Settle(t.Context(), batch, replies); err != nil {
			t.Fatalf("Settle %s = %v", what, err)
		}
		for k, r := range replies {
			if r.Err != nil || r.Granted != M {
				t.Errorf("Settle %s: reply %d = %+v, want granted %d", what, k, r, M)
			}
		}
		if got := b.log.take(); got != want {
			t.Errorf("Settle %s sent %q, want %q", what, got, want)
		}
	}, n
}

// TestSettleSpread settles many keys in one call; on the cluster they are
// spread over all three masters.
func TestSettleSpread(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		batch := make([]global.Settlement, 60)
		for i := range batch {
			batch[i] = global.Settlement{Key: fmt.Sprintf("user%d", i), Limit: slow, Consumed: M, Want: 2 * M, MinGrant: 1}
		}
		replies := make([]global.Reply, len(batch))
		if err := l.Settle(ctx, batch, replies); err != nil {
			t.Fatal(err)
		}
		for i, r := range replies {
			if r.Err != nil || r.Granted != 2*M || !about(r.Tokens, 7*M) {
				t.Errorf("reply %d = %+v, want granted %d tokens %d", i, r, 2*M, 7*M)
			}
		}
		cc, ok := b.rdb.(*redis.ClusterClient)
		if !ok {
			return
		}
		masters := map[string]int{}
		for _, s := range batch {
			node, err := cc.MasterForKey(ctx, l.Key(s.Key))
			if err != nil {
				t.Fatal(err)
			}
			masters[node.Options().Addr]++
		}
		if len(masters) != 3 {
			t.Errorf("keys on %d masters (%v), want 3", len(masters), masters)
		}
	})
}

// TestSettleClockBack checks on a clock that goes back (a failover to a
// node whose clock is behind) that the bucket neither refills nor moves its
// time back, so no interval is refilled twice.
func TestSettleClockBack(t *testing.T) {
	b := newMiniredis(t)
	l := newLimiter(t, b)
	steps := []struct {
		at      time.Duration
		want    int64
		granted int64
		tokens  int64
	}{
		{10 * time.Second, 10 * M, 10 * M, 0},
		{0, M, 0, 0},                        // back 10 s: no refill
		{9 * time.Second, M, 0, 0},          // still behind the stored time
		{10200 * time.Millisecond, 0, 0, M}, // 200 ms after it: 1 token
		{10 * time.Second, 0, 0, M},         // back again
	}
	replies := make([]global.Reply, 1)
	for i, s := range steps {
		b.m.SetTime(t0.Add(s.at))
		batch := []global.Settlement{{Key: "k", Limit: five, Want: s.want, MinGrant: s.want}}
		if err := l.Settle(t.Context(), batch, replies); err != nil {
			t.Fatal(err)
		}
		if r := replies[0]; r.Err != nil || r.Granted != s.granted || r.Tokens != s.tokens || !r.Now.Equal(t0.Add(s.at)) {
			t.Errorf("step %d: Settle(t0+%v, want %d) = %+v, want granted %d tokens %d", i, s.at, s.want, r, s.granted, s.tokens)
		}
	}
}

// TestSettleExpiry checks that a bucket expires when it is full again and
// then reads as full.
func TestSettleExpiry(t *testing.T) {
	b := newMiniredis(t)
	l := newLimiter(t, b)
	ctx := t.Context()
	replies := make([]global.Reply, 1)
	settle := func(s global.Settlement) global.Reply {
		t.Helper()
		s.Key, s.Limit = "k", five
		if err := l.Settle(ctx, []global.Settlement{s}, replies); err != nil || replies[0].Err != nil {
			t.Fatalf("Settle = %v, %v", err, replies[0].Err)
		}
		return replies[0]
	}
	settle(global.Settlement{Consumed: 10 * M})
	if got, want := b.m.TTL(l.Key("k")), 2*time.Second; got != want {
		t.Errorf("TTL = %v, want %v", got, want)
	}
	b.m.FastForward(2*time.Second - time.Millisecond)
	if !b.m.Exists(l.Key("k")) {
		t.Fatalf("key expired before the bucket is full")
	}
	b.m.FastForward(time.Millisecond)
	if b.m.Exists(l.Key("k")) {
		t.Fatalf("key alive when the bucket is full")
	}
	// The clock did not move: only the missing key makes it full.
	if r := settle(global.Settlement{}); r.Tokens != 10*M {
		t.Errorf("after expiry: tokens %d, want %d", r.Tokens, 10*M)
	}
}

// TestRoundTripFails checks that when Redis cannot be reached, Settle and
// Allow fail, and every sent key gets the error too.
func TestRoundTripFails(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{
		Addr:                     m.Addr(),
		MaxRetries:               -1, // fail fast once the server is gone
		DialerRetries:            1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		t.Fatal(err)
	}
	batch := []global.Settlement{
		{Key: "a", Limit: slow, Want: M},
		{Key: "", Limit: slow, Want: M},
		{Key: "c", Limit: slow, Want: M},
	}
	replies := make([]global.Reply, 3)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = l.Settle(ctx, batch, replies)
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "global: settle") {
		t.Errorf("Settle(cancelled) = %v, want global: settle ...: %v", err, context.Canceled)
	}
	for _, i := range []int{0, 2} {
		if !errors.Is(replies[i].Err, context.Canceled) {
			t.Errorf("Settle(cancelled): reply %d = %+v, want %v", i, replies[i], context.Canceled)
		}
	}
	if !errors.Is(replies[1].Err, global.ErrInvalidKey) {
		t.Errorf("Settle(cancelled): reply 1 = %+v, want %v", replies[1], global.ErrInvalidKey)
	}
	if _, err := l.Allow(ctx, "a", global.Limit{Rate: 1, Burst: 1}, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Allow(cancelled) = %v, want %v", err, context.Canceled)
	}

	m.Close()
	if err := l.Settle(t.Context(), batch, replies); err == nil {
		t.Errorf("Settle(server closed) = nil, want an error")
	}
	for _, i := range []int{0, 2} {
		if replies[i].Err == nil || errors.Is(replies[i].Err, global.ErrReply) {
			t.Errorf("Settle(server closed): reply %d = %+v, want a connection error", i, replies[i])
		}
	}
	if _, err := l.Allow(t.Context(), "a", global.Limit{Rate: 1, Burst: 1}, 1); err == nil {
		t.Errorf("Allow(server closed) = nil, want an error")
	}
}

// about reports whether got is want or a few micro-tokens more: what a
// bucket refilling one micro-token a second gains on a real clock while a
// test stalls.
func about(got, want int64) bool {
	return got >= want && got <= want+5
}
