package lua_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

// eval runs the script on key and returns its reply, which must be six
// integers. args are the script's arguments for one key but its debt
// (rate, burst, consumed, returned, want, min_grant, quantum, and instance
// and seq or not): eval sends the burst as the debt, as a Settlement does
// by default.
func eval(ctx context.Context, t *testing.T, rdb *redis.Client, key string, args ...any) [7]int64 {
	t.Helper()
	args = withDebt(args)
	v, err := rdb.Eval(ctx, lua.Settle, []string{key}, args...).Result()
	if err != nil {
		t.Fatalf("EVAL %v: %v", args, err)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 7 {
		t.Fatalf("EVAL %v = %#v, want 7 integers", args, v)
	}
	var r [7]int64
	for i, e := range a {
		if r[i], ok = e.(int64); !ok {
			t.Fatalf("EVAL %v = %#v, want 7 integers", args, v)
		}
	}
	return r
}

// withDebt returns the arguments of one key without a debt (7, or 9 with
// an instance and a seq) with the burst inserted as the debt, after the
// quantum.
func withDebt(args []any) []any {
	return slices.Insert(slices.Clone(args), 7, args[1])
}

// hash returns the fields of key.
func hash(ctx context.Context, t *testing.T, rdb *redis.Client, key string) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// near reports whether got is want or a few micro-tokens more: what a bucket
// refilling one micro-token a second gains on a real clock while a test
// stalls.
func near(got, want int64) bool {
	return got >= want && got <= want+5
}

// TestSettleDuplicate sends calls with and without a seq to one key, some of
// them again: a call whose seq is at or below its instance's last applied
// one changes nothing (the hash and its TTL stay as they were) and replies
// dup 1 with what that seq was granted, or dup 2 and 0 if superseded; each instance
// keeps its own record; calls without a seq are always applied and leave
// the records alone.
func TestSettleDuplicate(t *testing.T) {
	const M = 1_000_000
	// 1 micro-token a second, burst 10 tokens: the real clock hardly matters.
	call := func(consumed, returned, want, minGrant int64, seq ...any) []any {
		return append([]any{1, 10 * M, consumed, returned, want, minGrant, 1}, seq...)
	}
	steps := []struct {
		name    string
		args    []any
		granted int64
		tokens  int64
		dup     bool
		records map[string]string // the q: records after, as "<seq> <granted>"
	}{
		{"a applies seq 5", call(2*M, 0, 3*M, 1, "a", 5), 3 * M, 5 * M, false,
			map[string]string{"q:a": "5 3000000"}},
		{"a sends seq 5 again", call(2*M, 0, 3*M, 1, "a", 5), 3 * M, 5 * M, true,
			map[string]string{"q:a": "5 3000000"}},
		{"a sends seq 5 a third time", call(2*M, 0, 3*M, 1, "a", 5), 3 * M, 5 * M, true,
			map[string]string{"q:a": "5 3000000"}},
		{"a applies seq 9", call(M, 0, M, M, "a", 9), M, 3 * M, false,
			map[string]string{"q:a": "9 1000000"}},
		{"a sends seq 5 again, superseded", call(2*M, 0, 3*M, 1, "a", 5), 0, 3 * M, true,
			map[string]string{"q:a": "9 1000000"}},
		{"a sends seq 8, never applied but below 9", call(0, 2*M, 0, 0, "a", 8), 0, 3 * M, true,
			map[string]string{"q:a": "9 1000000"}},
		{"a sends seq 9 again", call(M, 0, M, M, "a", 9), M, 3 * M, true,
			map[string]string{"q:a": "9 1000000"}},
		{"b applies seq 1, below a's", call(M, 0, 0, 0, "b", 1), 0, 2 * M, false,
			map[string]string{"q:a": "9 1000000", "q:b": "1 0"}},
		{"b sends seq 1 again", call(M, 0, 0, 0, "b", 1), 0, 2 * M, true,
			map[string]string{"q:a": "9 1000000", "q:b": "1 0"}},
		{"a applies seq 10", call(0, M, 2*M, 2*M, "a", 10), 2 * M, M, false,
			map[string]string{"q:a": "10 2000000", "q:b": "1 0"}},
		{"no seq applies", call(0, 0, M, M), M, 0, false,
			map[string]string{"q:a": "10 2000000", "q:b": "1 0"}},
		{"no seq applies again", call(0, 0, M, 1), 0, 0, false,
			map[string]string{"q:a": "10 2000000", "q:b": "1 0"}},
		{"b applies seq 2 in debt", call(3*M, 0, M, 1, "b", 2), 0, -3 * M, false,
			map[string]string{"q:a": "10 2000000", "q:b": "2 0"}},
		{"a sends seq 10 again in debt", call(0, M, 2*M, 2*M, "a", 10), 2 * M, -3 * M, true,
			map[string]string{"q:a": "10 2000000", "q:b": "2 0"}},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		const key = "{dup}"
		for i, s := range steps {
			before := hash(ctx, t, b.rdb, key)
			ttlBefore := pttl(ctx, t, b, key)
			got := eval(ctx, t, b.rdb, key, s.args...)
			dup := int64(0) // 1 for a duplicate, 2 for one superseded since
			if s.dup {
				dup = 1
				if strings.Contains(s.name, "superseded") || strings.Contains(s.name, "below") {
					dup = 2
				}
			}
			if got[0] != s.granted || !near(got[1], s.tokens) || got[3] != 0 || got[4] != dup {
				t.Fatalf("step %d (%s): reply %v, want {%d, %d, now, 0, dup %d}", i, s.name, got, s.granted, s.tokens, dup)
			}
			after := hash(ctx, t, b.rdb, key)
			if s.dup {
				if !maps.Equal(after, before) {
					t.Errorf("step %d (%s): a duplicate changed the hash from %v to %v", i, s.name, before, after)
				}
				ttl := pttl(ctx, t, b, key)
				lo := ttlBefore
				if b.m == nil {
					lo -= 1000 // the real clock runs
				}
				if ttl < lo || ttl > ttlBefore {
					t.Errorf("step %d (%s): a duplicate moved the TTL from %d ms to %d ms", i, s.name, ttlBefore, ttl)
				}
				continue
			}
			if st := after["t"]; st != strconv.FormatInt(got[1], 10) {
				t.Errorf("step %d (%s): stored t = %s, want the reply's %d", i, s.name, st, got[1])
			}
			records := map[string]string{}
			for f, v := range after {
				if strings.HasPrefix(f, "q:") {
					records[f] = v
				}
			}
			if !slices.Equal(slices.Sorted(maps.Keys(records)), slices.Sorted(maps.Keys(s.records))) {
				t.Errorf("step %d (%s): records %v, want %v", i, s.name, records, s.records)
			}
			for f, want := range s.records {
				v := strings.Fields(records[f])
				if len(v) != 3 || v[0]+" "+v[1] != want {
					t.Errorf("step %d (%s): record %s = %q, want %q and a time", i, s.name, f, records[f], want)
				}
			}
			if len(s.args) == 9 {
				// The call's own record has the reply's time.
				f := "q:" + s.args[7].(string)
				if want := fmt.Sprintf("%v %d %d", s.args[8], got[0], got[2]); after[f] != want {
					t.Errorf("step %d (%s): record %s = %q, want %q: the seq, the grant and the reply's time", i, s.name, f, after[f], want)
				}
			}
		}
	})
}

// TestSettleDuplicateLostKey checks that a key that is gone (deleted,
// flushed, expired) or replaced (another type) has no records left: a call
// sent again, or one with a lower seq, is applied to a full bucket.
func TestSettleDuplicateLostKey(t *testing.T) {
	const M = 1_000_000
	args := func(seq int64) []any { return []any{1, 10 * M, 4 * M, 0, M, M, 1, "inst", seq} }
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		const key = "{lost}"
		lose := []struct {
			name  string
			reset int64 // in the reply of the call after
			do    func() error
		}{
			{"DEL", 0, func() error { return b.rdb.Del(ctx, key).Err() }},
			{"FLUSHALL", 0, func() error { return b.rdb.FlushAll(ctx).Err() }},
			{"SET over it", 1, func() error { return b.rdb.Set(ctx, key, "x", 0).Err() }},
			// Expiry is run on miniredis, below; a real server's clock would
			// have to be waited for, and to the script an expired key is a
			// missing one, as after DEL.
			{"expiry", 0, func() error { return b.rdb.Del(ctx, key).Err() }},
		}
		for _, l := range lose {
			for _, seq := range []int64{7, 3} { // the same seq, then a lower one
				if got := eval(ctx, t, b.rdb, key, args(7)...); got[0] != M || got[4] != 0 {
					t.Fatalf("%s: first call = %v, want granted %d, dup 0", l.name, got, M)
				}
				if got := eval(ctx, t, b.rdb, key, args(7)...); got[4] != 1 || got[0] != M || !near(got[1], 5*M) {
					t.Fatalf("%s: the call again = %v, want a duplicate granted %d, tokens %d", l.name, got, M, 5*M)
				}
				if l.name == "expiry" && b.m != nil {
					b.m.FastForward(b.m.TTL(key))
					if b.m.Exists(key) {
						t.Fatalf("%s: key still there after its TTL", l.name)
					}
				} else if err := l.do(); err != nil {
					t.Fatal(err)
				}
				// A full bucket, charged 4 and granted 1: as if new.
				if got := eval(ctx, t, b.rdb, key, args(seq)...); got[4] != 0 || got[0] != M || got[1] != 5*M || got[3] != l.reset {
					t.Errorf("%s: seq %d after = %v, want {%d, %d, now, %d, 0}: applied to a full bucket", l.name, seq, got, M, 5*M, l.reset)
				}
				if err := b.rdb.Del(ctx, key).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestSettleUnreadableRecord checks that a q: record or a p the script
// cannot read counts as none (a record) or 0 (p): the call is applied, its
// record written over the garbled one, and the bucket is kept, not reset.
func TestSettleUnreadableRecord(t *testing.T) {
	const M = 1_000_000
	records := []string{"", "x", "5", "5 1", "5 1 1 1", "0 1 1", "-5 1 1", "5 -1 1", "5 1 -1", "5 1.5 1", " 5 1 1",
		"5  1 1", "5 1 1\n", "5e0 1 1", "0x5 1 1", "9007199254740992 1 1", "5 9007199254740992 1", "99999999999999999999 1 1"}
	ps := []string{"", "x", "-3", "1.5", "nan", "9007199254740992"}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for i, rec := range records {
			key := fmt.Sprintf("{garbled record %d}", i)
			p := ps[i%len(ps)]
			// 4 tokens, so that a reset (a full bucket) would show.
			if err := b.rdb.HSet(ctx, key, "t", 4*M, "ts", redisNow(ctx, t, b.rdb, key), "q:a", rec, "p", p).Err(); err != nil {
				t.Fatal(err)
			}
			got := eval(ctx, t, b.rdb, key, 1, 10*M, 0, 0, M, M, 1, "a", 5)
			if got[0] != M || !near(got[1], 3*M) || got[3] != 0 || got[4] != 0 {
				t.Errorf("record %q, p %q: reply %v, want {%d, %d, now, 0, 0}: applied, no reset", rec, p, got, M, 3*M)
			}
			h := hash(ctx, t, b.rdb, key)
			if want := fmt.Sprintf("5 %d %d", M, got[2]); h["q:a"] != want {
				t.Errorf("record %q: after = %q, want %q", rec, h["q:a"], want)
			}
			if h["p"] != p {
				t.Errorf("record %q: p = %q after, want %q untouched (no prune at 4 fields)", rec, h["p"], p)
			}
		}
	})
}

// TestSettleDedupBounds checks the largest instance and seq the script
// takes, and every byte class of an instance.
func TestSettleDedupBounds(t *testing.T) {
	const M = 1_000_000
	const maxSeq = 1<<53 - 1
	instance := "az-AZ_09." + strings.Repeat("x", 64-9)
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		const key = "{bounds}"
		args := []any{1, 10 * M, 0, 0, M, M, 1, instance, maxSeq}
		if got := eval(ctx, t, b.rdb, key, args...); got[0] != M || got[4] != 0 {
			t.Fatalf("seq 2^53-1 = %v, want applied", got)
		}
		if rec, want := hash(ctx, t, b.rdb, key)["q:"+instance], "9007199254740991 1000000 "; !strings.HasPrefix(rec, want) {
			t.Errorf("record = %q, want %q and a time: every digit of the seq", rec, want)
		}
		if got := eval(ctx, t, b.rdb, key, args...); got[0] != M || got[4] != 1 {
			t.Errorf("seq 2^53-1 again = %v, want a duplicate", got)
		}
		args[8] = maxSeq - 1
		if got := eval(ctx, t, b.rdb, key, args...); got[0] != 0 || got[4] != 2 {
			t.Errorf("seq 2^53-2 after 2^53-1 = %v, want a superseded duplicate (dup 2) with granted 0", got)
		}
	})
}

// TestSettlePrune checks that a call that finds more than max(2*p, 64)
// fields deletes the q: records more than 10 minutes old and the unreadable
// ones, keeps the rest (younger records, its own, other fields), and sets p
// to the fields left; and that a hash at or below the threshold is left
// alone.
func TestSettlePrune(t *testing.T) {
	const M = 1_000_000
	const minute = 60 * M // µs
	tests := []struct {
		name        string
		old, young  int    // records 11 and 9 minutes old
		garbled     int    // unreadable records
		other       bool   // a field "x", not the script's
		p           string // "" for none
		pruned      bool
		fieldsAfter int // HLEN after, and so p if pruned
	}{
		// Fields: t, ts, x and p if any, the records, and the caller's own.
		{"64 fields, no p", 61, 0, 0, false, "", false, 64},
		{"65 fields, no p", 62, 0, 0, false, "", true, 4},
		{"65 fields, young and other kept", 29, 20, 12, true, "", true, 25},
		{"under 2p", 70, 0, 0, false, "40", false, 74},
		{"at 2p", 76, 0, 0, false, "40", false, 80},
		{"above 2p", 77, 0, 0, false, "40", true, 4},
		{"above 2p, young kept", 40, 37, 0, false, "40", true, 41},
		{"p unreadable is 0", 62, 0, 0, false, "x", true, 4},
		{"p above the fields", 5, 0, 1, false, "1000", true, 4},
		{"many", 2500, 100, 500, false, "", true, 104},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, tt := range tests {
			key := "{prune " + tt.name + "}"
			now := redisNow(ctx, t, b.rdb, key)
			fields := []any{"t", 4 * M, "ts", now}
			if tt.other {
				fields = append(fields, "x", "other")
			}
			if tt.p != "" {
				fields = append(fields, "p", tt.p)
			}
			for i := range tt.old {
				fields = append(fields, fmt.Sprintf("q:old%d", i), fmt.Sprintf("%d 0 %d", i+1, now-11*minute))
			}
			for i := range tt.young {
				fields = append(fields, fmt.Sprintf("q:young%d", i), fmt.Sprintf("%d 0 %d", i+1, now-9*minute))
			}
			for i := range tt.garbled {
				fields = append(fields, fmt.Sprintf("q:garbled%d", i), "?")
			}
			if err := b.rdb.HSet(ctx, key, fields...).Err(); err != nil {
				t.Fatal(err)
			}
			got := eval(ctx, t, b.rdb, key, 1, 10*M, 0, 0, M, M, 1, "self", 1)
			if got[0] != M || got[3] != 0 || got[4] != 0 {
				t.Fatalf("%s: reply %v, want applied", tt.name, got)
			}
			h := hash(ctx, t, b.rdb, key)
			if len(h) != tt.fieldsAfter {
				t.Errorf("%s: %d fields after, want %d", tt.name, len(h), tt.fieldsAfter)
			}
			if _, ok := h["q:self"]; !ok {
				t.Errorf("%s: the caller's own record is gone", tt.name)
			}
			if h["t"] == "" || h["ts"] == "" || tt.other && h["x"] != "other" {
				t.Errorf("%s: t, ts, x = %q, %q, %q after, want them kept", tt.name, h["t"], h["ts"], h["x"])
			}
			var old, young, garbled int
			for f := range h {
				switch {
				case strings.HasPrefix(f, "q:old"):
					old++
				case strings.HasPrefix(f, "q:young"):
					young++
				case strings.HasPrefix(f, "q:garbled"):
					garbled++
				}
			}
			if tt.pruned {
				if old != 0 || garbled != 0 || young != tt.young {
					t.Errorf("%s: pruned to %d old, %d young, %d unreadable records; want 0, %d, 0", tt.name, old, young, garbled, tt.young)
				}
				if want := strconv.Itoa(tt.fieldsAfter); h["p"] != want {
					t.Errorf("%s: p = %q after a prune, want %s, the fields left", tt.name, h["p"], want)
				}
				continue
			}
			if old != tt.old || young != tt.young || garbled != tt.garbled || h["p"] != tt.p {
				t.Errorf("%s: %d old, %d young, %d unreadable records, p %q; want all %d, %d, %d and p %q kept", tt.name, old, young, garbled, h["p"], tt.old, tt.young, tt.garbled, tt.p)
			}
		}
	})
}

// TestSettleMany checks that one call carrying many keys does to each what a
// call per key would, in order: the same replies and the same records, with
// a key named twice seeing its first step, a bucket of another type reset,
// de-duplication per key and instance, and keys without a seq.
func TestSettleMany(t *testing.T) {
	const M = 1_000_000
	type call struct {
		key  string
		args []any // 9: no debt (withDebt)
	}
	calls := []call{
		{"{a}", []any{1, 10 * M, 2 * M, 0, 3 * M, 1, 1, "x", 5}},
		{"{b}", []any{1, 10 * M, 0, 0, M, M, 1, "", 0}},
		{"{a}", []any{1, 10 * M, 2 * M, 0, 3 * M, 1, 1, "x", 5}}, // a duplicate of the first
		{"{c}", []any{1, 5 * M, 0, 0, 6 * M, 6 * M, 1, "y", 1}},  // all or nothing: nothing
		{"{a}", []any{1, 10 * M, 0, 4 * M, 0, 0, 1, "y", 9}},     // another instance gives 4 back
		{"{wrong}", []any{1, 10 * M, M, 0, 0, 0, 1, "", 0}},      // a string: reset
		{"{b}", []any{7, 3 * M, 0, M, 2 * M, M, M, "x", 6}},      // another limit on the same key
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		for _, p := range []string{"one:", "many:"} {
			if err := b.rdb.Set(ctx, p+"{wrong}", "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		var one [][7]int64
		for _, c := range calls {
			args := c.args
			if args[7] == "" {
				args = args[:7] // one key: the 7-argument form
			}
			one = append(one, eval(ctx, t, b.rdb, "one:"+c.key, args...))
		}
		// What the calls mean, one by one: {a} 10-2-3 = 5, then a
		// duplicate, then y gives 4 back; {c} grants nothing of 6 from 5;
		// {wrong} is reset.
		if one[0][0] != 3*M || one[2][4] != 1 || one[3][0] != 0 || !near(one[4][1], 9*M) || one[5][3] != 1 {
			t.Fatalf("calls one by one: %v", one)
		}
		var keys []string
		var args []any
		for _, c := range calls {
			keys = append(keys, "many:"+c.key)
			args = append(args, withDebt(c.args)...)
		}
		v, err := b.rdb.Eval(ctx, lua.Settle, keys, args...).Int64Slice()
		if err != nil || len(v) != 7*len(calls) {
			t.Fatalf("EVAL of %d keys = %v, %v; want %d integers", len(calls), v, err, 7*len(calls))
		}
		for i, c := range calls {
			got, want := v[7*i:7*i+7], one[i]
			if got[0] != want[0] || !near(got[1], want[1]) && !near(want[1], got[1]) || got[3] != want[3] || got[4] != want[4] {
				t.Errorf("call %d (%s): %v in one call, %v alone", i, c.key, got, want)
			}
			if got[2] != v[2] {
				t.Errorf("call %d: time %d, want the call's one time %d", i, got[2], v[2])
			}
		}
		for _, k := range []string{"{a}", "{b}", "{c}", "{wrong}"} {
			if t1, t2 := b.rdb.Type(ctx, "one:"+k).Val(), b.rdb.Type(ctx, "many:"+k).Val(); t1 != t2 || t1 != "hash" {
				if t1 != t2 {
					t.Errorf("%s: a %s after calls one by one, a %s after one call", k, t1, t2)
				}
				continue
			}
			h1, h2 := hash(ctx, t, b.rdb, "one:"+k), hash(ctx, t, b.rdb, "many:"+k)
			if !slices.Equal(slices.Sorted(maps.Keys(h1)), slices.Sorted(maps.Keys(h2))) {
				t.Errorf("%s: fields %v after calls one by one, %v after one call", k, h1, h2)
			}
		}
	})
}

// TestSettleAll checks the all-or-nothing call: when one key's bucket cannot
// grant its min_grant, no key is granted anything; when every one can, each
// is; and it takes decisions alone, each key once.
func TestSettleAll(t *testing.T) {
	const M = 1_000_000
	decide := func(cost int64) []any { return []any{1, 10 * M, 0, 0, cost, cost, 1, 10 * M, "", 0} }
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		keys := []string{"{all}a", "{all}b", "{all}c"}
		// b holds 1 token, the others are full.
		eval(ctx, t, b.rdb, keys[1], 1, 10*M, 9*M, 0, 0, 0, 1)
		call := func(costs ...int64) []int64 {
			t.Helper()
			var args []any
			for _, c := range costs {
				args = append(args, decide(c)...)
			}
			v, err := b.rdb.Eval(ctx, lua.Settle, keys, append(args, "all")...).Int64Slice()
			if err != nil || len(v) != 21 {
				t.Fatalf("all-or-nothing call %v = %v, %v", costs, v, err)
			}
			return v
		}
		v := call(2*M, 2*M, 2*M) // b is short: nothing for anyone
		for i, want := range []int64{10 * M, M, 10 * M} {
			if v[7*i] != 0 || !near(v[7*i+1], want) {
				t.Errorf("b short, key %d: granted %d, tokens %d; want 0 and %d", i, v[7*i], v[7*i+1], want)
			}
		}
		v = call(2*M, M, 3*M) // each can: all granted
		for i, want := range []int64{8 * M, 0, 7 * M} {
			if g := []int64{2 * M, M, 3 * M}[i]; v[7*i] != g || !near(v[7*i+1], want) {
				t.Errorf("all can, key %d: granted %d, tokens %d; want %d and %d", i, v[7*i], v[7*i+1], g, want)
			}
		}
		for _, bad := range []struct {
			name string
			keys []string
			args []any
			want string
		}{
			{"consumed", keys[:1], []any{1, 10 * M, M, 0, M, M, 1, 10 * M, "", 0, "all"}, "decisions alone"},
			{"seq", keys[:1], []any{1, 10 * M, 0, 0, M, M, 1, 10 * M, "x", 3, "all"}, "decisions alone"},
			{"a key twice", []string{keys[0], keys[0]}, append(decide(M), append(decide(M), "all")...), "each key once"},
		} {
			if _, err := b.rdb.Eval(ctx, lua.Settle, bad.keys, bad.args...).Result(); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("%s: %v, want an error with %q", bad.name, err, bad.want)
			}
		}
	})
}
