package lua_test

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

// backend is a Redis to run the script on.
type backend struct {
	rdb *redis.Client
	m   *miniredis.Miniredis // nil on a real server
}

// eachBackend runs f on miniredis, with its clock set, and on a real
// redis-server, which skips without one.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		m.SetTime(time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC))
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { rdb.Close() })
		f(t, backend{rdb: rdb, m: m})
	})
	t.Run("redis", func(t *testing.T) {
		p := redistest.Server(t)
		f(t, backend{rdb: redistest.Client(t, p)})
	})
}

func TestSettleRejectsArguments(t *testing.T) {
	ok := []string{"5000000", "10000000", "0", "0", "1000000", "1000000", "1000000", "10000000"}
	with := func(i int, v string) []string {
		a := append([]string(nil), ok...)
		a[i] = v
		return a
	}
	seq := func(instance, seq string) []string {
		return append(append([]string(nil), ok...), instance, seq)
	}
	outage := func(instance, seq, since, claim string) []string {
		return append(append([]string(nil), ok...), instance, seq, since, claim)
	}
	tests := []struct {
		name string
		keys []string
		argv []string
		want string // in the error
	}{
		{"no key", nil, ok, "want 1 to 1000 keys, got 0"},
		{"two keys, 8 args", []string{"{a}x", "{a}y"}, ok, "want 10 or 12 arguments a key for 2 keys, got 8"},
		{"two keys, 10 args", []string{"{a}x", "{a}y"}, seq("a", "1"), "want 10 or 12 arguments a key for 2 keys, got 10"},
		{"two keys, bad second", []string{"{a}x", "{a}y"}, append(seq("a", "1"), append(with(1, "0"), "", "0")...), "key 2: burst"},
		{"two keys, bad first", []string{"{a}x", "{a}y"}, append(seq("a", "0"), seq("", "0")...), "key 1: seq 0"},
		{"two keys, no instance with a seq", []string{"{a}x", "{a}y"}, append(seq("", "0"), seq("", "3")...), "key 2: instance of 0 bytes"},
		{"1001 keys", slices.Repeat([]string{"{a}x"}, 1001), slices.Repeat(seq("", "0"), 1001), "want 1 to 1000 keys, got 1001"},
		{"one key, no instance", []string{"k"}, seq("", "0"), "instance of 0 bytes"},
		{"five args", []string{"k"}, ok[:5], "want 8 arguments"},
		{"seven args, no debt", []string{"k"}, ok[:7], "want 8 arguments"},
		{"nine args", []string{"k"}, append(with(0, "1"), "1"), "want 8 arguments"},
		{"eleven args", []string{"k"}, append(seq("a", "1"), "1"), "or 12 (then since, claim), got 11"},
		{"thirteen args", []string{"k"}, append(outage("a", "1", "5", "0"), "1"), "or 12 (then since, claim), got 13"},
		{"since negative", []string{"k"}, outage("a", "1", "-1", "0"), "since -1"},
		{"since fraction", []string{"k"}, outage("a", "1", "1.5", "0"), "since 1.5"},
		{"since 2^53", []string{"k"}, outage("a", "1", "9007199254740992", "0"), "since"},
		{"since text", []string{"k"}, outage("a", "1", "then", "0"), "since"},
		{"claim above consumed", []string{"k"}, outage("a", "1", "5", "1"), "claim 1 is not an integer in [0, consumed]"},
		{"claim negative", []string{"k"}, outage("a", "1", "5", "-1"), "claim"},
		{"claim without since", []string{"k"}, append(with(2, "7"), "a", "1", "0", "1"), "claim needs a since"},
		{"since without seq", []string{"{a}x", "{a}y"}, append(outage("", "0", "5", "0"), outage("a", "2", "0", "0")...), "key 1: since needs an instance and seq"},
		{"two keys, 12 args, bad second", []string{"{a}x", "{a}y"}, append(outage("a", "1", "5", "0"), outage("a", "2", "x", "0")...), "key 2: since"},
		{"instance empty", []string{"k"}, seq("", "1"), "instance of 0 bytes"},
		{"instance 65 bytes", []string{"k"}, seq(strings.Repeat("a", 65), "1"), "instance of 65 bytes"},
		{"instance space", []string{"k"}, seq("a b", "1"), "instance"},
		{"instance colon", []string{"k"}, seq("a:b", "1"), "instance"},
		{"instance brace", []string{"k"}, seq("a{b}", "1"), "instance"},
		{"instance newline", []string{"k"}, seq("a\n", "1"), "instance"},
		{"instance NUL", []string{"k"}, seq("a\x00", "1"), "instance"},
		{"instance unicode", []string{"k"}, seq("é", "1"), "instance"},
		{"instance percent", []string{"k"}, seq("a%d", "1"), "instance"},
		{"seq zero", []string{"k"}, seq("a", "0"), "seq"},
		{"seq negative", []string{"k"}, seq("a", "-1"), "seq"},
		{"seq fraction", []string{"k"}, seq("a", "1.5"), "seq"},
		{"seq 2^53", []string{"k"}, seq("a", "9007199254740992"), "seq"},
		{"seq text", []string{"k"}, seq("a", "next"), "seq"},
		{"seq empty", []string{"k"}, seq("a", ""), "seq"},
		{"seq nan", []string{"k"}, seq("a", "nan"), "seq"},
		{"bad amount before a good seq", []string{"k"}, append(with(4, "-1"), "a", "1"), "want"},
		{"rate text", []string{"k"}, with(0, "fast"), "rate"},
		{"rate zero", []string{"k"}, with(0, "0"), "rate"},
		{"rate negative", []string{"k"}, with(0, "-5"), "rate"},
		{"rate fraction", []string{"k"}, with(0, "1.5"), "rate"},
		{"rate over 2^50", []string{"k"}, with(0, "1125899906842625"), "rate"},
		{"rate empty", []string{"k"}, with(0, ""), "rate"},
		{"burst zero", []string{"k"}, with(1, "0"), "burst"},
		{"burst nan", []string{"k"}, with(1, "nan"), "burst"},
		{"burst inf", []string{"k"}, with(1, "inf"), "burst"},
		{"consumed negative", []string{"k"}, with(2, "-1"), "consumed"},
		{"returned fraction", []string{"k"}, with(3, "0.5"), "returned"},
		{"want 2^53", []string{"k"}, with(4, "9007199254740992"), "want"},
		{"min_grant text", []string{"k"}, with(5, "x"), "min_grant"},
		{"quantum missing", []string{"k"}, ok[:6], "want 8 arguments (rate, burst, consumed, returned, want, min_grant, quantum, debt)"},
		{"quantum zero", []string{"k"}, with(6, "0"), "quantum"},
		{"quantum fraction", []string{"k"}, with(6, "1000000.5"), "quantum"},
		{"quantum text", []string{"k"}, with(6, "whole"), "quantum"},
		{"quantum over 2^50", []string{"k"}, with(6, "1125899906842625"), "quantum"},
		{"debt negative", []string{"k"}, with(7, "-1"), "debt"},
		{"debt fraction", []string{"k"}, with(7, "0.5"), "debt"},
		{"debt over 2^50", []string{"k"}, with(7, "1125899906842625"), "debt"},
		{"debt text", []string{"k"}, with(7, "all"), "debt"},
		// A string cached as a valid amount of an earlier key is no debt
		// for a later one: each kind of number is checked against its own
		// bounds.
		{"debt over 2^50, an amount before", []string{"{a}x", "{a}y"},
			append(append(with(2, "1125899906842625"), "", "0"), append(with(7, "1125899906842625"), "", "0")...), "key 2: debt"},
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
			v, err := b.rdb.Eval(ctx, lua.Settle, keys, args...).Result()
			if err == nil || !strings.Contains(err.Error(), "hybrid: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: EVAL = %v, %v; want an error with %q", tt.name, v, err, "hybrid: ...")
			}
		}
		n, err := b.rdb.DBSize(ctx).Result()
		if err != nil || n != 0 {
			t.Errorf("DBSIZE after rejected calls = %d, %v; want 0", n, err)
		}
	})
}

// model is the script's arithmetic in exact integers, for one bucket.
type model struct {
	t, ts int64
	ok    bool // false: the key is missing
}

// refilled returns the bucket as step would see it after its refill, for
// a duplicate, which writes nothing: m is left alone.
func (m model) refilled(now, rate, burst int64) int64 {
	m.step(now, rate, burst, 0, 0, 0, 0, 1, burst)
	return m.t
}

// step applies one call at Redis time now and returns what the script must
// reply and the TTL bounds in ms it must set.
func (m *model) step(now, rate, burst, consumed, returned, want, minGrant, quantum, debt int64) (granted, forgiven int64, ttlLo, ttlHi int64) {
	if !m.ok {
		m.t, m.ts, m.ok = burst, now, true
	}
	m.t = min(max(m.t, -1<<50), burst)
	if now > m.ts {
		if m.t < burst {
			add := new(big.Int).Mul(big.NewInt(now-m.ts), big.NewInt(rate))
			add.Quo(add, big.NewInt(1e6))
			if add.Cmp(big.NewInt(burst-m.t)) >= 0 {
				m.t = burst
			} else {
				m.t += add.Int64()
			}
		}
		m.ts = now
	}
	m.t = min(burst, m.t+returned)
	floor := min(m.t, -debt)
	if m.t-consumed < floor {
		forgiven = floor - (m.t - consumed)
	}
	m.t = max(floor, m.t-consumed)
	granted = min(want, max(m.t, 0))
	granted -= granted % quantum
	if granted < minGrant {
		granted = 0
	}
	m.t -= granted

	num := new(big.Int).Mul(big.NewInt(burst-m.t), big.NewInt(1000))
	q, r := new(big.Int).QuoRem(num, big.NewInt(rate), new(big.Int))
	ttl := q.Int64()
	if r.Sign() > 0 {
		ttl++
	}
	ttlLo, ttlHi = ttl, ttl
	if num.Cmp(new(big.Int).Lsh(big.NewInt(1), 53)) >= 0 {
		ttlHi += 2 // the numerator is rounded; the script adds a margin
	}
	if m.ts > now {
		skew := (m.ts - now + 999) / 1000
		ttlLo += skew
		ttlHi += skew
	}
	clamp := func(v int64) int64 { return min(max(v, 1000), 1<<43) }
	return granted, forgiven, clamp(ttlLo), clamp(ttlHi)
}

// seqCall is a call with a seq, as it was sent.
type seqCall struct {
	instance string
	seq      int64
	args     []any // nil: no seq
	granted  int64
}

// pick returns a random value from a mix of edge cases and uniform draws.
func pick(r *rand.Rand, edges []int64, lo, hi int64) int64 {
	if r.IntN(3) == 0 {
		return edges[r.IntN(len(edges))]
	}
	return lo + r.Int64N(hi-lo+1)
}

// TestSettleModel runs random calls with random limits, amounts, quanta,
// clock jumps and stored states against the exact integer model, up to 2^50
// micro-tokens of burst, rate and quantum and 2^53 of amounts.
func TestSettleModel(t *testing.T) {
	const maxLimit = 1 << 50
	const maxAmount = 1<<53 - 1
	rates := []int64{1, 3, 7, 999_999, 1_000_000, 1_000_001, 5_000_000, 333_333_333, 1e15, maxLimit}
	bursts := []int64{1, 1_000_000, 10_000_000, 999_999_999_999, 1e15, maxLimit}

	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		r := rand.New(rand.NewPCG(1, 2))
		rq := rand.New(rand.NewPCG(3, 4)) // quanta, so that they leave the draws of r alone
		rs := rand.New(rand.NewPCG(5, 6)) // seqs and re-sends, likewise
		rd := rand.New(rand.NewPCG(7, 8)) // debts, likewise
		seqs := map[string]int64{"i-1": 0, "i.2": 1 << 40}
		steps := 800
		if testing.Short() {
			steps = 200
		}
		for k := range 8 {
			key := fmt.Sprintf("model:{%d}", k)
			var m model
			rate := pick(r, rates, 1, maxLimit)
			burst := pick(r, bursts, 1, maxLimit)
			var sent []seqCall           // the calls with a seq applied to key
			last := map[string]seqCall{} // by instance: its record
			for i := range steps {
				// Sometimes the stored state is overwritten: any tokens
				// (even beyond the burst) and any age, or a time ahead.
				if r.IntN(4) == 0 {
					now := redisNow(ctx, t, b.rdb, key)
					m.t = r.Int64N(6*burst+1) - 3*burst
					switch r.IntN(3) {
					case 0:
						m.ts = now - r.Int64N(now+1)
					case 1:
						m.ts = now - r.Int64N(10_000_000)
					default:
						m.ts = now + r.Int64N(10_000_000)
					}
					m.ok = true
					// In either of its forms: a hash keeps its records; a
					// string or no key becomes a string or a hash.
					var err error
					if typ := b.rdb.Type(ctx, key).Val(); typ != "hash" && r.IntN(2) == 0 {
						err = b.rdb.Set(ctx, key, fmt.Sprintf("%d %d", m.t, m.ts), 0).Err()
					} else {
						if typ != "hash" {
							b.rdb.Del(ctx, key)
						}
						err = b.rdb.HSet(ctx, key, "t", m.t, "ts", m.ts).Err()
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				if b.m != nil && r.IntN(3) == 0 {
					// Jump the clock, forward up to days or back up to 10 s.
					now := time.UnixMicro(redisNow(ctx, t, b.rdb, key))
					d := time.Duration(r.Int64N(int64(72*time.Hour))) >> r.IntN(40)
					if r.IntN(4) == 0 {
						d = -time.Duration(r.Int64N(int64(10 * time.Second)))
					}
					b.m.SetTime(now.Add(d))
				}
				if r.IntN(20) == 0 {
					rate = pick(r, rates, 1, maxLimit)
					burst = pick(r, bursts, 1, maxLimit)
				}
				amount := func() int64 {
					switch r.IntN(6) {
					case 0:
						return 0
					case 1:
						return maxAmount
					default:
						return r.Int64N(3*burst + 1)
					}
				}
				consumed, returned, want := amount(), amount(), amount()
				minGrant := r.Int64N(want + 1)
				if r.IntN(2) == 0 {
					minGrant = min(want, 1)
				}
				var quantum int64 = 1
				switch rq.IntN(3) {
				case 1:
					quantum = 1_000_000
				case 2:
					quantum = 1 + rq.Int64N(min(want+1, maxLimit))
				}

				debt := burst // what a Settlement sends by default
				switch rd.IntN(4) {
				case 1:
					debt = 0
				case 2:
					debt = min(rd.Int64N(4*burst+1), maxLimit)
				case 3:
					debt = maxLimit
				}

				args := []any{rate, burst, consumed, returned, want, minGrant, quantum, debt}
				var call seqCall
				switch rs.IntN(4) {
				case 0: // no seq
				case 1: // a call sent again, as it was
					if len(sent) > 0 {
						call = sent[rs.IntN(len(sent))]
						break
					}
					fallthrough
				default: // a new seq
					call.instance = "i-1"
					if rs.IntN(2) == 0 {
						call.instance = "i.2"
					}
					seqs[call.instance] += 1 + rs.Int64N(3)
					call.seq = seqs[call.instance]
					call.args = append(args, call.instance, call.seq)
				}
				if call.args != nil {
					args = call.args
				}
				v, err := b.rdb.Eval(ctx, lua.Settle, []string{key}, args...).Result()
				if err != nil {
					t.Fatalf("step %d: EVAL: %v", i, err)
				}
				a := v.([]any)
				if len(a) != 7 {
					t.Fatalf("step %d: reply %v, want 7 integers", i, a)
				}
				got := [7]int64{a[0].(int64), a[1].(int64), a[2].(int64), a[3].(int64), a[4].(int64), a[5].(int64), a[6].(int64)}
				if got[3] != 0 {
					t.Fatalf("key %d step %d: reset = %d on a readable bucket, want 0", k, i, got[3])
				}
				if rec, ok := last[call.instance]; call.args != nil && ok && call.seq <= rec.seq {
					// A duplicate: what its seq was granted, the bucket as
					// refilled, and nothing written.
					var granted int64
					dup := int64(2) // superseded since
					if call.seq == rec.seq {
						granted, dup = rec.granted, 1
					}
					a := call.args
					tokens := m.refilled(got[2], a[0].(int64), a[1].(int64))
					if got[0] != granted || got[1] != tokens || got[4] != dup || got[5] != 0 {
						t.Fatalf("key %d step %d: seq %d of %s sent again (last %d, granted %d): reply %v, want {%d, %d, now, 0, %d}",
							k, i, call.seq, call.instance, rec.seq, rec.granted, got, granted, tokens, dup)
					}
					st, sts, _, err := redistest.Bucket(ctx, b.rdb, key)
					if err != nil {
						t.Fatal(err)
					}
					if st != m.t || sts != m.ts {
						t.Fatalf("key %d step %d: a duplicate stored t=%d ts=%d, want %d %d unchanged", k, i, st, sts, m.t, m.ts)
					}
					continue
				}
				if got[4] != 0 {
					t.Fatalf("key %d step %d: reply %v, dup 1 for a call that is none", k, i, got)
				}
				before := m
				granted, forgiven, ttlLo, ttlHi := m.step(got[2], rate, burst, consumed, returned, want, minGrant, quantum, debt)
				if got[0] != granted || got[1] != m.t || got[5] != forgiven {
					t.Fatalf("key %d step %d: state %+v, now %d, rate %d, burst %d, consumed %d, returned %d, want %d, min %d, quantum %d, debt %d:\ngot granted %d tokens %d forgiven %d, want %d %d %d",
						k, i, before, got[2], rate, burst, consumed, returned, want, minGrant, quantum, debt, got[0], got[1], got[5], granted, m.t, forgiven)
				}
				if call.args != nil {
					call.granted = granted
					sent = append(sent, call)
					last[call.instance] = call
					rec, err := b.rdb.HGet(ctx, key, "q:"+call.instance).Result()
					if want := fmt.Sprintf("%d %d %d", call.seq, granted, got[2]); err != nil || rec != want {
						t.Fatalf("key %d step %d: record of %s = %q, %v; want %q", k, i, call.instance, rec, err, want)
					}
				}
				st, sts, _, err := redistest.Bucket(ctx, b.rdb, key)
				if err != nil {
					t.Fatal(err)
				}
				if st != m.t || sts != m.ts {
					t.Fatalf("key %d step %d: stored t=%d ts=%d, want %d %d", k, i, st, sts, m.t, m.ts)
				}
				// A call with a record leaves a hash; one without leaves a
				// string, unless the key was a hash already.
				if typ := b.rdb.Type(ctx, key).Val(); call.args != nil && typ != "hash" {
					t.Fatalf("key %d step %d: a call with a record left a %s, want a hash", k, i, typ)
				}
				ttl := pttl(ctx, t, b, key)
				lo := ttlLo
				if b.m == nil {
					lo -= 1000 // a real clock runs between the call and PTTL
				}
				if ttl < lo || ttl > ttlHi {
					t.Fatalf("key %d step %d: TTL %d ms, want [%d, %d] (tokens %d, burst %d, rate %d)", k, i, ttl, lo, ttlHi, m.t, burst, rate)
				}
			}
		}
	})
}

// TestSettleUnreadableState checks that a bucket the script cannot read, a
// hash or a string, is replaced by a full bucket, rather than left stuck,
// and that the reply says so; a missing key is a full bucket too, but not a
// reset. A call without a record leaves a string, one with a record a hash.
func TestSettleUnreadableState(t *testing.T) {
	tests := []struct {
		name   string
		fields []any // nil: no key; one value: a string
		reset  int64
	}{
		{"missing", nil, 0},
		{"string text", []any{"abc"}, 1},
		{"string one number", []any{"5"}, 1},
		{"string fraction", []any{"1.5 1"}, 1},
		{"string ts negative", []any{"5 -1"}, 1},
		{"string ts beyond 2^53", []any{"5 9007199254740993"}, 1},
		{"string three numbers", []any{"5 1 1"}, 1},
		{"t text", []any{"t", "abc", "ts", "1"}, 1},
		{"t fraction", []any{"t", "1.5", "ts", "1"}, 1},
		{"t missing", []any{"ts", "1"}, 1},
		{"ts missing", []any{"t", "5"}, 1},
		{"ts negative", []any{"t", "5", "ts", "-1"}, 1},
		{"ts beyond 2^53", []any{"t", "5", "ts", "9007199254740993"}, 1},
		{"other fields only", []any{"x", "1"}, 1},
		{"garbage besides", []any{"t", "nan", "ts", "1", "x", "1"}, 1},
		{"records only", []any{"q:a", "5 1000000 1", "q:b", "7 0 1"}, 1},
		{"p only", []any{"p", "3"}, 1},
		{"records and p, no ts", []any{"t", "5", "q:a", "5 1000000 1", "p", "3"}, 1},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, record := range []bool{false, true} {
			for _, tt := range tests {
				key := fmt.Sprintf("{%s %v}", tt.name, record)
				switch len(tt.fields) {
				case 0:
				case 1:
					if err := b.rdb.Set(ctx, key, tt.fields[0], 0).Err(); err != nil {
						t.Fatal(err)
					}
				default:
					if err := b.rdb.HSet(ctx, key, tt.fields...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				args := []any{1, 10_000_000, 0, 0, 1_000_000, 0, 1, 10_000_000}
				if record {
					args = append(args, "z", 1)
				}
				v, err := b.rdb.Eval(ctx, lua.Settle, []string{key}, args...).Result()
				if err != nil {
					t.Fatalf("%s: EVAL: %v", tt.name, err)
				}
				a := v.([]any)
				if a[0] != int64(1_000_000) || a[1] != int64(9_000_000) || a[3] != tt.reset {
					t.Errorf("%s, record %v: reply %v, want {1000000, 9000000, now, %d}: a full bucket", tt.name, record, a, tt.reset)
				}
				if tokens, _, ok, err := redistest.Bucket(ctx, b.rdb, key); err != nil || !ok || tokens != 9_000_000 {
					t.Errorf("%s, record %v: bucket after = %d, %v, %v; want 9000000", tt.name, record, tokens, ok, err)
				}
				if !record {
					if typ := b.rdb.Type(ctx, key).Val(); typ != "string" {
						t.Errorf("%s: a %s after, want a string", tt.name, typ)
					}
					continue
				}
				if got, err := b.rdb.HKeys(ctx, key).Result(); err != nil || len(got) != 3 {
					t.Errorf("%s, record: HKEYS after = %q, %v; want [t ts q:z] alone", tt.name, got, err)
				}
			}
		}
	})
}

// TestSettleWrongType checks that a key holding another type than a hash
// (someone SET over the bucket) is replaced by a full bucket, with reset 1
// in the reply, instead of failing with WRONGTYPE forever.
func TestSettleWrongType(t *testing.T) {
	tests := []struct {
		name  string
		write func(ctx context.Context, rdb *redis.Client, key string) error
	}{
		{"string", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "v", 0).Err()
		}},
		{"string with TTL", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "v", time.Hour).Err()
		}},
		{"list", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.RPush(ctx, key, "a", "b").Err()
		}},
		{"set", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.SAdd(ctx, key, "a").Err()
		}},
		{"sorted set", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}).Err()
		}},
		{"stream", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"f", "v"}}).Err()
		}},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, tt := range tests {
			key := "{" + tt.name + "}"
			if err := tt.write(ctx, b.rdb, key); err != nil {
				t.Fatal(err)
			}
			// Charge 3 tokens, take 2 of a bucket of 10 at 1 token/s.
			args := []any{1_000_000, 10_000_000, 3_000_000, 0, 2_000_000, 0, 1, 10_000_000}
			v, err := b.rdb.Eval(ctx, lua.Settle, []string{key}, args...).Result()
			if err != nil {
				t.Fatalf("%s: EVAL = %v, want a reply", tt.name, err)
			}
			if a := v.([]any); a[0] != int64(2_000_000) || a[1] != int64(5_000_000) || a[3] != int64(1) {
				t.Errorf("%s: reply %v, want {2000000, 5000000, now, 1}: a full bucket, charged", tt.name, a)
			}
			if tokens, _, ok, err := redistest.Bucket(ctx, b.rdb, key); err != nil || !ok || tokens != 5_000_000 {
				t.Errorf("%s: bucket after = %d, %v, %v; want 5000000", tt.name, tokens, ok, err)
			}
			// The bucket is the script's again: the next call is no reset.
			v, err = b.rdb.Eval(ctx, lua.Settle, []string{key}, args...).Result()
			if err != nil {
				t.Fatalf("%s: second EVAL = %v", tt.name, err)
			}
			if a := v.([]any); a[3] != int64(0) || a[1].(int64) > 2_000_000 {
				t.Errorf("%s: second reply %v, want no reset and the first call's charge kept", tt.name, a)
			}
			// The TTL is the bucket's, not what the other value had.
			if ttl := pttl(ctx, t, b, key); ttl <= 0 || ttl > 20_000 {
				t.Errorf("%s: PTTL after = %d ms, want the bucket's, at most 20 s", tt.name, ttl)
			}
		}
	})
}

// TestSettleClockBack checks that a Redis clock that goes back (a failover
// to a server whose clock is behind) mints nothing: the bucket does not
// refill until the clock is past the time it was last written at again, and
// then only for the time after it, and its timestamp never moves back.
func TestSettleClockBack(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := t.Context()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	const key = "{back}"
	// 1 token/s, burst 10: each step takes all there is (want 10 tokens).
	steps := []struct {
		at      time.Duration // Redis time, from t0
		granted int64         // micro-tokens
		ts      time.Duration // stored, from t0
	}{
		{0, 10_000_000, 0},              // a full bucket, emptied
		{-10 * time.Second, 0, 0},       // back 10 s: no refill, ts stays
		{-time.Hour, 0, 0},              // further back
		{-500 * time.Millisecond, 0, 0}, // still behind t0
		{0, 0, 0},                       // caught up: nothing elapsed since t0
		{1500 * time.Millisecond, 1_500_000, 1500 * time.Millisecond}, // 1.5 s past t0
		{-time.Minute, 0, 1500 * time.Millisecond},
		{2 * time.Second, 500_000, 2 * time.Second},
	}
	for i, s := range steps {
		m.SetTime(t0.Add(s.at))
		v, err := rdb.Eval(ctx, lua.Settle, []string{key}, 1_000_000, 10_000_000, 0, 0, 10_000_000, 0, 1, 10_000_000).Result()
		if err != nil {
			t.Fatalf("step %d: EVAL: %v", i, err)
		}
		a := v.([]any)
		if a[0] != s.granted || a[1] != int64(0) || a[2] != t0.Add(s.at).UnixMicro() || a[3] != int64(0) {
			t.Errorf("step %d (Redis time %v from t0): reply %v, want {%d, 0, %d, 0}", i, s.at, a, s.granted, t0.Add(s.at).UnixMicro())
		}
		if _, got, _, err := redistest.MiniBucket(m, key); err != nil || got != t0.Add(s.ts).UnixMicro() {
			t.Errorf("step %d: stored ts %d, %v; want %d (%v from t0)", i, got, err, t0.Add(s.ts).UnixMicro(), s.ts)
		}
		// The TTL covers the time until the clock is back at ts, plus the
		// refill: the key does not expire (and so read as full) meanwhile.
		behind := max(s.ts-s.at, 0)
		if ttl, want := m.TTL(key), behind+10*time.Second; ttl < want || ttl > want+time.Millisecond {
			t.Errorf("step %d: TTL %v, want %v", i, ttl, want)
		}
	}
}

// redisNow returns the Redis time in µs on the node of key.
func redisNow(ctx context.Context, t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	v, err := rdb.Eval(ctx, "local t = redis.call('TIME') return t[1] * 1000000 + t[2]", []string{key}).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// pttl returns the TTL of key in ms: exact on miniredis, whose TTLs do not
// follow SetTime.
func pttl(ctx context.Context, t *testing.T, b backend, key string) int64 {
	t.Helper()
	if b.m != nil {
		return b.m.TTL(key).Milliseconds()
	}
	d, err := b.rdb.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d.Milliseconds()
}

// TestSettleDebt checks the debt argument: a charge sinks the bucket to
// -debt at most; a bucket in deeper debt (charged under a larger one) stays
// where it is, whatever later calls say, and refills from there; the TTL
// runs until the bucket is full again.
func TestSettleDebt(t *testing.T) {
	const M = 1_000_000
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		// 1 token/s, burst 10, nothing granted: {consumed, debt} -> tokens.
		steps := []struct {
			name             string
			consumed, debt   int64
			tokens, ttlLoSec int64
			forgiven         int64 // less what a real clock refilled between calls
		}{
			{"charged in full within the debt", 35 * M, 30 * M, -25 * M, 35, 0},
			{"floored at -debt", 10 * M, 30 * M, -30 * M, 40, 5 * M},
			{"a smaller debt forgives nothing already owed, and charges nothing more", 5 * M, 10 * M, -30 * M, 40, 5 * M},
			{"no debt, nothing charged: stays", 0, 0, -30 * M, 40, 0},
		}
		const key = "{debt}"
		for _, s := range steps {
			v := eval1(ctx, t, b.rdb, key, M, 10*M, s.consumed, 0, 0, 0, 1, s.debt)
			// A real clock refills a little between calls.
			if v[1] < s.tokens || v[1] > s.tokens+M/10 {
				t.Errorf("%s: tokens %d, want %d", s.name, v[1], s.tokens)
			}
			if v[5] > s.forgiven || v[5] < s.forgiven-M/10 {
				t.Errorf("%s: forgiven %d, want %d", s.name, v[5], s.forgiven)
			}
			if ttl := pttl(ctx, t, b, key); ttl < s.ttlLoSec*1000-1000 || ttl > s.ttlLoSec*1000 {
				t.Errorf("%s: TTL %d ms, want about %d s: until the bucket is full", s.name, ttl, s.ttlLoSec)
			}
		}
		// The burst as the debt: the bound the script had before it took one.
		v := eval1(ctx, t, b.rdb, "{burst}", M, 10*M, 35*M, 0, 0, 0, 1, 10*M)
		if v[1] < -10*M || v[1] > -10*M+M/10 || v[5] != 15*M {
			t.Errorf("debt = burst: tokens %d, forgiven %d; want -10 tokens, 15 forgiven", v[1], v[5])
		}
		if b.m == nil {
			return
		}
		// 20 s later the bucket of 30 owed has refilled 20.
		b.m.SetTime(time.UnixMicro(redisNow(ctx, t, b.rdb, key)).Add(20 * time.Second))
		if v := eval1(ctx, t, b.rdb, key, M, 10*M, 0, 0, 0, 0, 1, 0); v[1] != -10*M {
			t.Errorf("20 s after: tokens %d, want -10 tokens", v[1])
		}
	})
}

// eval1 runs the script on key with args as they are (the 8 or 10 of one
// key) and returns its reply.
func eval1(ctx context.Context, t *testing.T, rdb *redis.Client, key string, args ...any) [7]int64 {
	t.Helper()
	v, err := rdb.Eval(ctx, lua.Settle, []string{key}, args...).Int64Slice()
	if err != nil || len(v) != 7 {
		t.Fatalf("EVAL %v = %v, %v; want 7 integers", args, v, err)
	}
	return [7]int64(v)
}
