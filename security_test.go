package hybrid_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/lua"
)

// The security tests run against real redis-server processes: user keys
// that look like Redis syntax or break hash tags, and the caller's client
// options for passwords, ACL users and TLS.

// hostileKeys returns user keys that try to reach another key's state or
// break the hash tag: braces, line breaks, NUL bytes, RESP framing, other
// keys' names, glob characters, unicode and invalid UTF-8, and keys of the
// largest valid size. They are all distinct.
func hostileKeys(t *testing.T) []string {
	t.Helper()
	all := make([]byte, 1024) // every byte value, four times
	for i := range all {
		all[i] = byte(i)
	}
	keys := []string{
		"{", "}", "{}", "}{", "{{", "}}", "a}b{c", "a{b}c", "{a}", "a}", "a}}", "}a", "a",
		"fleet", "fleet}", "{fleet}", "fleet{fleet}", ":fleet{fleet", "hybrid:fleet{fleet}", "hybrid:{a}",
		"line\nbreak", "\n", "cr\rlf\r\n", "\r\n", "nul\x00byte", "\x00", "\x00\x00", "nul}\x00{",
		"*1\r\n$4\r\nPING\r\n",
		"x}\r\n*2\r\n$3\r\nDEL\r\n$6\r\ncanary\r\n",
		"*1\r\n$8\r\nFLUSHALL\r\n",
		"\"quoted\" 'single'", " ", "*", "?", "[a-z]", "\\", "%s%d",
		"ключ", "🔑}{🔒", "\xff\xfe\xfd", "ｆｕｌｌ",
		string(all),
		strings.Repeat("}{", 512),
		strings.Repeat("k", 1024),
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Fatalf("hostileKeys: %q twice", k)
		}
		seen[k] = true
	}
	return keys
}

// hashTag returns what Redis Cluster hashes for key: the bytes between the
// first '{' and the first '}' after it, if there are any, else the whole
// key.
func hashTag(key string) string {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return key
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e <= 0 {
		return key
	}
	return key[s+1 : s+1+e]
}

// keyLimit is the limit of the key tests: a rate so low that the buckets
// refill less than a token over a test, and a burst every cost fits in.
var keyLimit = hybrid.Limit{Rate: slow, Burst: 10}

// keyCost is what the key tests take from key i of prefix j: neighbouring
// keys and prefixes take different amounts, so two that shared a bucket
// would show in its tokens.
func keyCost(i, j int) int64 { return 1 + int64(i+3*j)%int64(keyLimit.Burst) }

// chargeKeys takes keyCost(i, j) tokens of each keys[i] with a Limiter of
// prefix on rdb, requiring every decision to be allowed with Redis, checks
// the fleet set, then closes the Limiter, which gives the leases back.
func chargeKeys(t *testing.T, rdb redis.UniversalClient, admin redis.UniversalClient, prefix string, j int, keys []string) {
	t.Helper()
	ctx := t.Context()
	// Generous deadlines: a call that outlived the default 50ms (a Cluster
	// node's first, under the race detector on a busy machine) would deny
	// its keys as unanswered, as TestBatchIsolation once saw in CI; what
	// is tested here is where the tokens go.
	l, err := hybrid.New(rdb, hybrid.Config{
		Prefix: prefix, InstanceID: "keys-" + strconv.Itoa(j),
		ColdWait: 10 * time.Second, Breaker: breaker.Config{CallTimeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for i, k := range keys {
		res, err := l.AllowN(ctx, k, keyLimit, keyCost(i, j))
		if err != nil || !res.Allowed || res.Source == hybrid.SourceFallback {
			t.Errorf("prefix %q: AllowN(%.40q, %d) = %+v, %v; want allowed with Redis", prefix, k, keyCost(i, j), res, err)
		}
	}
	g := newGlobal(t, rdb, prefix)
	// The fleet set is there (once the Limiter's goroutine has sent its
	// first heartbeat), a sorted set that no bucket key names.
	var typ string
	var terr error
	pollUntil(5*time.Second, 10*time.Millisecond, func() bool {
		typ, terr = admin.Type(ctx, g.FleetKey()).Result()
		return terr == nil && typ == "zset"
	})
	if terr != nil || typ != "zset" {
		t.Errorf("prefix %q: TYPE %q = %q, %v; want zset", prefix, g.FleetKey(), typ, terr)
	}
	for _, k := range keys {
		if g.Key(k) == g.FleetKey() {
			t.Errorf("prefix %q: the bucket key of %q is the fleet key %q", prefix, k, g.FleetKey())
		}
	}
	st := l.Stats()
	if st.Reconcile.KeyErrors+st.Reconcile.FetchErrors+st.Reconcile.HeartbeatErrors+st.FallbackAllowed+st.FallbackDenied > 0 {
		t.Errorf("prefix %q: errors or fallback decisions with Redis up: %+v", prefix, st)
	}
	if err := l.Close(ctx); err != nil {
		t.Errorf("prefix %q: Close: %v", prefix, err)
	}
}

// newGlobal returns a global.Limiter with prefix on rdb.
func newGlobal(t *testing.T, rdb global.Client, prefix string) *global.Limiter {
	t.Helper()
	g, err := global.New(rdb, global.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// keyPrefixes are the prefixes the key tests run with, "" being the
// default: close to each other and to the default, and with bytes other
// than braces that a prefix may hold.
var keyPrefixes = []string{"", "hybrid:", "hybrid:fleet", "tenant\x00a\r\n*1\r\n"}

// checkBuckets checks that Redis holds exactly one bucket per key and
// prefix, plus the extra keys, and that each bucket was charged its
// keyCost: no key reached another's state. scan lists every key in Redis.
func checkBuckets(t *testing.T, rdb redis.UniversalClient, keys []string, extra []string, scan func() []string) {
	t.Helper()
	ctx := t.Context()
	want := map[string]string{} // Redis key -> what it should be
	for _, x := range extra {
		want[x] = "extra key " + strconv.Quote(x)
	}
	for j, p := range keyPrefixes {
		g := newGlobal(t, rdb, p)
		for i, k := range keys {
			rk := g.Key(k)
			if other, dup := want[rk]; dup {
				t.Errorf("prefix %q, key %.40q: Redis key %.60q is also %s", p, k, rk, other)
			}
			want[rk] = "prefix " + strconv.Quote(p) + " key " + strconv.Quote(k)
			got, err := redistest.BucketTokens(ctx, rdb, rk)
			if err != nil {
				t.Errorf("prefix %q, key %.40q: bucket %.60q: %v", p, k, rk, err)
				continue
			}
			wantT := (keyLimit.Burst - keyCost(i, j)) * micro
			// The refill over the test is far below a token.
			if err != nil || got < wantT || got > wantT+micro/2 {
				t.Errorf("prefix %q, key %.40q: bucket holds %d micro-tokens, want %d (its own cost %d charged, nothing else)", p, k, got, wantT, keyCost(i, j))
			}
		}
	}
	got := scan()
	for _, rk := range got {
		if _, ok := want[rk]; !ok {
			t.Errorf("Redis holds %.80q, which is no bucket and no expected key", rk)
		}
	}
	if len(got) != len(want) {
		t.Errorf("Redis holds %d keys, want %d: %d prefixes x %d user keys + %d", len(got), len(want), len(keyPrefixes), len(keys), len(extra))
	}
}

// scanAll returns every key of a standalone server.
func scanAll(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(t.Context(), 0, "*", 1000).Iterator()
	for iter.Next(t.Context()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	return keys
}

// TestKeysIsolated: hostile user keys, under four prefixes, on a real
// redis-server. Every decision is made with Redis; afterwards Redis holds
// exactly one bucket per key and prefix, each charged its own cost and
// nothing else (the encoding is injective and no key reaches another's
// state); the fleet set is a key of its own; and nothing in a key was run as
// a command (the canary key is still there, the store holds nothing else).
func TestKeysIsolated(t *testing.T) {
	srv := redistest.Server(t)
	if !srv.Owned() {
		t.Skip("REDIS_ADDR names a shared server: this test counts every key in it")
	}
	admin := redistest.Client(t, srv)
	ctx := t.Context()
	if err := admin.Set(ctx, "canary", "alive", 0).Err(); err != nil {
		t.Fatal(err)
	}
	keys := hostileKeys(t)
	for j, p := range keyPrefixes {
		chargeKeys(t, redistest.Client(t, srv), admin, p, j, keys)
	}
	checkBuckets(t, admin, keys, []string{"canary"}, func() []string { return scanAll(t, admin) })
	if got, err := admin.Get(ctx, "canary").Result(); err != nil || got != "alive" {
		t.Errorf("GET canary = %q, %v; want alive", got, err)
	}
}

// TestKeysCluster: the same keys on a 3-master Redis Cluster. Every
// decision is made with Redis and no settlement fails (each script call
// touches one key, so no key's braces can make a CROSSSLOT); every bucket
// is charged its own cost; and each bucket key lands in the slot of the
// hash tag docs/design.md describes: the user key up to its first '}', or
// the whole Redis key when the user key starts with '}'.
func TestKeysCluster(t *testing.T) {
	c := redistest.Cluster(t)
	if !c.Owned() {
		t.Skip("REDIS_CLUSTER_ADDRS names a shared cluster: this test counts every key in it")
	}
	admin := redistest.ClusterClient(t, c)
	ctx := t.Context()
	keys := hostileKeys(t)
	for j, p := range keyPrefixes {
		chargeKeys(t, redistest.ClusterClient(t, c), admin, p, j, keys)
	}
	checkBuckets(t, admin, keys, nil, func() []string {
		var all []string
		holding := 0
		for _, p := range c.Nodes() {
			got := scanAll(t, redistest.Client(t, p))
			if len(got) > 0 {
				holding++
			}
			all = append(all, got...)
		}
		if holding < 2 {
			t.Errorf("the buckets sit on %d of %d masters, want at least 2", holding, len(c.Nodes()))
		}
		return all
	})
	g := newGlobal(t, admin, "")
	for _, k := range keys {
		rk := g.Key(k)
		tag := k
		if i := strings.IndexByte(k, '}'); i == 0 {
			tag = rk
		} else if i > 0 {
			tag = k[:i]
		}
		if hashTag(rk) != tag {
			t.Errorf("key %.40q: hash tag of %.60q is %.40q, want %.40q", k, rk, hashTag(rk), tag)
		}
		got, err1 := admin.ClusterKeySlot(ctx, rk).Result()
		want, err2 := admin.ClusterKeySlot(ctx, tag).Result()
		if err := errors.Join(err1, err2); err != nil || got != want {
			t.Errorf("key %.40q: CLUSTER KEYSLOT %.60q = %d, want %d, the slot of %.40q (%v)", k, rk, got, want, tag, err)
		}
	}
	// The exact limiter, one script call per decision, on the same keys.
	for _, k := range keys {
		if _, err := g.Allow(ctx, k, global.Limit{Rate: slow, Burst: 10}, 1); err != nil {
			t.Errorf("global.Allow(%.40q) on the cluster: %v", k, err)
		}
	}
}

// TestKeyBounds: keys above 1024 bytes (1 KB + 1, 10 KB, 10 KB of braces
// and line breaks) and the empty key are ErrInvalidKey at every entry
// point, before anything is sent to Redis; a key of exactly 1024 bytes is
// valid.
func TestKeyBounds(t *testing.T) {
	srv := redistest.Server(t)
	if !srv.Owned() {
		t.Skip("REDIS_ADDR names a shared server: this test counts every key in it")
	}
	rdb := redistest.Client(t, srv)
	l, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	// global gets a client of its own, whose commands are counted.
	grdb := redistest.Client(t, srv)
	var sent redistest.Counter
	grdb.AddHook(&sent)
	g := newGlobal(t, grdb, "")
	ctx := t.Context()
	lim := hybrid.Limit{Rate: 10, Burst: 10}
	tenKB := strings.Repeat("0123456789", 1024)
	for _, key := range []string{
		"",
		strings.Repeat("k", 1025),
		tenKB,
		strings.Repeat("}{\r\n\x00", 2048),
		tenKB + "}",
	} {
		calls := map[string]error{}
		_, calls["Allow"] = l.Allow(ctx, key, lim)
		_, calls["Reserve"] = l.Reserve(ctx, key, lim, 1)
		calls["Wait"] = l.Wait(ctx, key, lim)
		_, calls["AllowAll"] = l.AllowAll(ctx, hybrid.Check{Tier: "t", Key: key, Limit: lim})
		_, calls["Exact"] = l.Allow(ctx, key, hybrid.Limit{Rate: 10, Burst: 10, Mode: hybrid.Exact})
		_, calls["global.Allow"] = g.Allow(ctx, key, global.Limit{Rate: 10, Burst: 10}, 1)
		var replies [1]global.Reply
		m, _ := global.Limit{Rate: 10, Burst: 10}.Micro()
		calls["global.Settle"] = g.Settle(ctx, []global.Settlement{{Key: key, Limit: m, Consumed: micro}}, replies[:])
		if calls["global.Settle"] == nil {
			calls["global.Settle"] = replies[0].Err
		}
		for name, err := range calls {
			if !errors.Is(err, hybrid.ErrInvalidKey) {
				t.Errorf("%s(key of %d bytes) = %v, want ErrInvalidKey", name, len(key), err)
			}
		}
	}
	if got := sent.Load(); got != 0 {
		t.Errorf("global sent %d commands for invalid keys, want 0", got)
	}
	if st := l.Stats(); st.Reconcile.Keys != 0 {
		t.Errorf("%d keys tracked after only invalid calls, want 0", st.Reconcile.Keys)
	}
	for _, k := range scanAll(t, rdb) {
		// The fleet set, and the instance's last beat beside it.
		if k != g.FleetKey() && !strings.HasPrefix(k, g.FleetKey()+":") {
			t.Errorf("Redis holds %q after only invalid calls, want at most the fleet set and the last beats", k)
		}
	}
	for _, key := range []string{strings.Repeat("k", 1024), strings.Repeat("}", 1024)} {
		if res, err := l.Allow(ctx, key, lim); err != nil || !res.Allowed {
			t.Errorf("Allow(key of 1024 bytes %.8q...) = %+v, %v; want allowed", key, res, err)
		}
	}
}

// TestPrefixBraces: a prefix with a brace would move the hash tag, so
// global.New and hybrid.New refuse it; a prefix with other unusual bytes is
// accepted (TestKeysIsolated runs one).
func TestPrefixBraces(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	for _, p := range []string{"{", "}", "a{b", "a}b", "{x}", "hybrid:{", "}{"} {
		if _, err := global.New(rdb, global.Config{Prefix: p}); err == nil {
			t.Errorf("global.New(prefix %q) = nil error, want one", p)
		}
		if l, err := hybrid.New(rdb, hybrid.Config{Prefix: p}); err == nil {
			l.Close(context.Background())
			t.Errorf("hybrid.New(prefix %q) = nil error, want one", p)
		}
	}
}

// limiterCommands returns the commands the limiter needs permission for:
// EVALSHA and EVAL (go-redis sends a script by hash, and by source when
// Redis does not have it cached), and every command the scripts call,
// read from their sources (redis.call, redis.pcall, or the locals rcall and
// rpcall that settle.lua keeps them in).
func limiterCommands(t *testing.T) []string {
	t.Helper()
	cmds := []string{"evalsha", "eval"}
	re := regexp.MustCompile(`(?:redis\.p?call|\brp?call)\(\s*'([A-Za-z]+)'`)
	for _, src := range []string{lua.Settle, lua.Heartbeat} {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			if c := strings.ToLower(m[1]); !slices.Contains(cmds, c) {
				cmds = append(cmds, c)
			}
		}
	}
	if len(cmds) < 5 {
		t.Fatalf("found only %v in the scripts", cmds)
	}
	return cmds
}

// limiterRules returns the ACL rules of a user that may run the limiter
// with the default prefix and nothing else, leaving out the command skip
// (none if "").
func limiterRules(t *testing.T, skip string) []string {
	rules := []string{"~hybrid:*"}
	for _, c := range limiterCommands(t) {
		if c != skip {
			rules = append(rules, "+"+c)
		}
	}
	return rules
}

// secClient returns a client of addr as a caller would build one, with
// credentials and TLS from its options, closed at cleanup.
func secClient(t *testing.T, addr, user, password string, tc *tls.Config) *redis.Client {
	t.Helper()
	if err := redistest.CheckLoopback(addr); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		Username:              user,
		Password:              password,
		TLSConfig:             tc,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// workThrough checks that a Limiter on rdb works: a lease is fetched and
// spent, the heartbeat counts the instance, a garbled bucket is replaced,
// and Close gives the lease back, all seen through admin.
func workThrough(t *testing.T, rdb, admin redis.UniversalClient) {
	t.Helper()
	ctx := t.Context()
	l, err := hybrid.New(rdb, hybrid.Config{InstanceID: "works"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lim := hybrid.Limit{Rate: slow, Burst: 10}
	g := newGlobal(t, admin, "")
	// A bucket someone overwrote with another type: the script replaces
	// it (this needs DEL).
	if err := admin.Set(ctx, g.Key("garbled"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k", "garbled"} {
		for i := range 3 {
			res, err := l.Allow(ctx, key, lim)
			if err != nil || !res.Allowed || res.Source == hybrid.SourceFallback {
				t.Fatalf("%s: Allow #%d = %+v, %v; want allowed with Redis; stats %+v", key, i+1, res, err, l.Stats())
			}
		}
	}
	for _, mode := range []hybrid.Mode{hybrid.Optimistic, hybrid.Exact} {
		lm := hybrid.Limit{Rate: slow, Burst: 10, Mode: mode}
		if res, err := l.Allow(ctx, "k-"+mode.String(), lm); err != nil || !res.Allowed || res.Source == hybrid.SourceFallback {
			t.Errorf("%v: Allow = %+v, %v; want allowed, not by fallback", mode, res, err)
		}
	}
	// The first heartbeat goes out from the Limiter's goroutine: wait for
	// it (nothing signals it).
	var live int64
	var zerr error
	pollUntil(5*time.Second, 10*time.Millisecond, func() bool {
		live, zerr = admin.ZCard(ctx, g.FleetKey()).Result()
		return zerr == nil && live == 1
	})
	if zerr != nil || live != 1 {
		t.Errorf("ZCARD %s = %d, %v; want 1 instance", g.FleetKey(), live, zerr)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st := l.Stats()
	if st.Reconcile.KeyErrors+st.Reconcile.FetchErrors+st.Reconcile.HeartbeatErrors+st.Reconcile.RoundErrors+st.ExactErrors > 0 {
		t.Errorf("errors: %+v", st)
	}
	for _, key := range []string{"k", "garbled", "k-optimistic"} {
		want := 7 * micro
		if key == "k-optimistic" {
			want = 9 * micro
		}
		if got, err := redistest.BucketTokens(ctx, admin, g.Key(key)); err != nil || got < int64(want) || got > int64(want)+micro/2 {
			t.Errorf("after Close, bucket %q holds %d micro-tokens (%v), want %d", key, got, err, want)
		}
	}
	if n, err := admin.Exists(ctx, g.FleetKey()).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS %s after Close = %d, %v; want 0: the instance left", g.FleetKey(), n, err)
	}
}

// failsThrough checks that a Limiter on rdb, which Redis refuses, answers
// every decision by its fallback policy without an error or a panic, and
// counts the failures; and that global.Limiter's calls report an error that
// holds one of wants (any error if wants is empty).
func failsThrough(t *testing.T, rdb redis.UniversalClient, prefix string, wants ...string) {
	t.Helper()
	ctx := t.Context()
	l, err := hybrid.New(rdb, hybrid.Config{Prefix: prefix, Instances: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lim := hybrid.Limit{Rate: slow, Burst: 3}
	// A call that is refused goes to the fallback at once. One that does not
	// come back within ColdWait (a TLS handshake loading the system's roots
	// can take that long; a server that waits for a handshake the client
	// never starts) is denied while the breaker is closed: Redis may only be
	// slow, until it has answered nothing for MaxCallTimeout; then three
	// calls that time out open the breaker. Those denials come within that
	// and a few call timeouts, before the breaker opens.
	until := time.Now().Add(breaker.DefaultMaxCallTimeout + 8*breaker.DefaultCallTimeout)
	unanswered, fallbacks := 0, 0
	for i := 0; fallbacks < 5; i++ {
		res, err := l.Allow(ctx, "k", lim)
		switch {
		case err == nil && res.Source == hybrid.SourceRedis && !res.Allowed && fallbacks == 0 && time.Now().Before(until):
			unanswered++
		case err != nil || res.Source != hybrid.SourceFallback || res.Allowed != (fallbacks < 3):
			t.Fatalf("Allow #%d = %+v, %v; want answered by the fallback (LocalShare: 3 allowed, then denied), no error", i+1, res, err)
		default:
			fallbacks++
		}
	}
	st := l.Stats()
	if st.Unanswered != uint64(unanswered) {
		t.Errorf("Stats().Unanswered = %d, want %d", st.Unanswered, unanswered)
	}
	if st.Reconcile.FetchErrors == 0 || st.FallbackAllowed != 3 {
		t.Errorf("stats %+v; want failed fetches counted and 3 fallback admissions", st)
	}
	// A refusal (wrong or no credentials, an ACL that denies) fails the
	// calls for the breaker, as no connection would: three in a row open it,
	// and the fallback decides without a round trip each.
	if !st.Degraded || st.Reconcile.Breaker == breaker.Closed {
		t.Errorf("breaker %v, Degraded %v after 5 refused requests; want it open", st.Reconcile.Breaker, st.Degraded)
	}
	t.Logf("refused: breaker %v, fetch errors %d, key errors %d, round errors %d", st.Reconcile.Breaker, st.Reconcile.FetchErrors, st.Reconcile.KeyErrors, st.Reconcile.RoundErrors)
	g := newGlobal(t, rdb, prefix)
	m, _ := global.Limit{Rate: 1, Burst: 1}.Micro()
	var replies [1]global.Reply
	settleErr := g.Settle(ctx, []global.Settlement{{Key: "k", Limit: m, Want: micro}}, replies[:])
	_, allowErr := g.Allow(ctx, "k", global.Limit{Rate: 1, Burst: 1}, 1)
	_, _, beatErr := g.Heartbeat(ctx, "id", time.Second)
	for name, err := range map[string]error{"Allow": allowErr, "Settle": errors.Join(settleErr, replies[0].Err), "Heartbeat": beatErr} {
		if err == nil || len(wants) > 0 && !slices.ContainsFunc(wants, func(w string) bool { return strings.Contains(err.Error(), w) }) {
			t.Errorf("global.%s = %v, want an error with one of %q", name, err, wants)
		}
	}
	if err := l.Close(ctx); err == nil {
		t.Logf("Close with Redis refusing: nil (the consumption could not be charged)")
	} else {
		t.Logf("Close with Redis refusing: %v", err)
	}
}

// TestAuthPassword: a Limiter works through a client with the server's
// password (requirepass), and answers by its fallback, with the error in
// global's calls, through a client with a wrong password or none.
func TestAuthPassword(t *testing.T) {
	srv := redistest.AuthServer(t, redistest.AuthOptions{Password: "pw-limiter"})
	admin := secClient(t, srv.Addr(), "", "pw-limiter", nil)
	workThrough(t, secClient(t, srv.Addr(), "", "pw-limiter", nil), admin)
	failsThrough(t, secClient(t, srv.Addr(), "", "wrong", nil), "", "WRONGPASS")
	// Without a password Redis answers NOAUTH, or refuses the long
	// command of an unauthenticated client before it reads it and closes
	// the connection (EOF): any error will do.
	failsThrough(t, secClient(t, srv.Addr(), "", "", nil), "")
}

// TestAuthACL: a Limiter works through an ACL user allowed the key pattern
// "hybrid:*" and the commands of limiterCommands, and no others; each of
// those commands is needed (a user without it fails one of a fetch, a
// garbled bucket's reset, the pruning of old records, a heartbeat or a
// leave, with a permission error);
// a prefix outside the pattern and a wrong password fail cleanly; and
// docs/design.md lists the same rules.
func TestAuthACL(t *testing.T) {
	cmds := limiterCommands(t)
	users := []redistest.User{{Name: "limiter", Password: "pw-acl", Rules: limiterRules(t, "")}}
	for _, c := range cmds {
		users = append(users, redistest.User{Name: "no-" + c, Password: "pw-acl", Rules: limiterRules(t, c)})
	}
	srv := redistest.AuthServer(t, redistest.AuthOptions{Password: "pw-admin", Users: users})
	admin := secClient(t, srv.Addr(), "", "pw-admin", nil)
	ctx := t.Context()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	workThrough(t, secClient(t, srv.Addr(), "limiter", "pw-acl", nil), admin)

	for _, c := range cmds {
		// Each user starts with no script cached, as after a restart.
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		rdb := secClient(t, srv.Addr(), "no-"+c, "pw-acl", nil)
		g := newGlobal(t, rdb, "")
		if err := admin.Set(ctx, g.Key("garbled-"+c), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		// A bucket with 65 records of instances gone for 10 minutes: the
		// next settlement with a sequence number prunes them.
		crowded := []any{"t", "1000000", "ts", "1"}
		for i := range 65 {
			crowded = append(crowded, "q:gone"+strconv.Itoa(i), "1 0 0")
		}
		if err := admin.HSet(ctx, g.Key("crowded-"+c), crowded...).Err(); err != nil {
			t.Fatal(err)
		}
		m, _ := global.Limit{Rate: 1, Burst: 1}.Micro()
		var rep [1]global.Reply
		err5 := g.Settle(ctx, []global.Settlement{{Key: "crowded-" + c, Limit: m, Consumed: micro, Instance: "me", Seq: 1}}, rep[:])
		_, err1 := g.Allow(ctx, "new-"+c, global.Limit{Rate: 1, Burst: 1}, 1)
		_, err2 := g.Allow(ctx, "garbled-"+c, global.Limit{Rate: 1, Burst: 1}, 1)
		_, _, err3 := g.Heartbeat(ctx, "id", time.Second)
		_, err4 := g.Leave(ctx, "id", time.Second)
		err := errors.Join(err1, err2, err3, err4, err5, rep[0].Err)
		if err == nil {
			t.Errorf("a user without %q ran the limiter: the command is not needed, drop it from the rules", c)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "NOPERM") && !strings.Contains(msg, "can't run this command") {
			t.Errorf("a user without %q: %v; want a permission error", c, err)
		}
	}

	limiter := secClient(t, srv.Addr(), "limiter", "pw-acl", nil)
	failsThrough(t, limiter, "other", "NOPERM")
	failsThrough(t, secClient(t, srv.Addr(), "limiter", "wrong", nil), "", "WRONGPASS")

	doc, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "ACL SETUSER limiter on >password resetkeys ~hybrid:* -@all +" + strings.Join(cmds, " +")
	m := regexp.MustCompile(`ACL SETUSER limiter on >password resetkeys ~hybrid:\* -@all((?: \+[a-z]+)+)`).FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/design.md has no ACL SETUSER line; want\n\t%s", want)
	}
	documented := strings.Fields(strings.ReplaceAll(string(m[1]), "+", ""))
	slices.Sort(documented)
	needed := slices.Sorted(slices.Values(cmds))
	if !slices.Equal(documented, needed) {
		t.Errorf("docs/design.md allows the commands %v, want %v:\n\t%s", documented, needed, want)
	}
}

// TestAuthTLS: a Limiter works through a client with the caller's TLS
// configuration (the server's CA, a client certificate) and a password,
// and answers by its fallback through a client that speaks plain text to
// the TLS port or does not trust the server.
func TestAuthTLS(t *testing.T) {
	certs, err := redistest.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.AuthServer(t, redistest.AuthOptions{Password: "pw-tls", TLS: certs})
	admin := secClient(t, srv.Addr(), "", "pw-tls", nil)
	workThrough(t, secClient(t, srv.TLSAddr(), "", "pw-tls", certs.ClientTLS()), admin)

	untrusting := certs.ClientTLS()
	untrusting.RootCAs = nil // the system's roots, which do not hold the test CA
	failsThrough(t, secClient(t, srv.TLSAddr(), "", "pw-tls", untrusting), "", "certificate")
	failsThrough(t, secClient(t, srv.TLSAddr(), "", "pw-tls", nil), "")
}
