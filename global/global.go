// Package global is the authoritative token bucket in Redis. A bucket is one
// key (a string, or a hash once numbered settlements keep their records in
// it), changed only by one Lua script (package lua), so every change
// is atomic, and timed only by Redis TIME, so the clocks of the callers do not
// matter. State is integer micro-tokens and a timestamp, and every write sets
// a TTL that ends when the bucket would be full again, so idle keys vanish.
//
// Each bucket is one hash-tagged key, so the same code runs on a standalone
// Redis, Sentinel and Redis Cluster: anything that implements Client, such
// as redis.UniversalClient. A script call carries one key on a Cluster, and
// many on a single Redis.
//
// Settle changes many buckets in one pipelined round trip: it is what an
// in-process tier uses to reconcile its shadow buckets. Allow is the plain
// exact limiter, one script call per decision. Heartbeat and Leave count the
// live instances of the fleet that shares the buckets, in a sorted set kept
// by a second script.
package global

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

// Client is what global needs from go-redis: scripts and pipelines.
// redis.UniversalClient (Client, ClusterClient, Ring, failover clients)
// satisfies it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

var _ Client = redis.UniversalClient(nil)

// Config configures a Limiter. The zero value is ready to use.
type Config struct {
	// Prefix starts every Redis key: Prefix + ":{" + key + "}" for the
	// bucket of key, and Prefix + ":fleet{fleet}" for the fleet set (see
	// Limiter.FleetKey). It may not contain '{' or '}'. "" means "hybrid".
	Prefix string
}

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "hybrid"

// Limit is a token-bucket limit: Rate tokens per second refill a bucket that
// holds at most Burst tokens.
type Limit = limit.Limit

// MicroLimit is a validated Limit in micro-tokens, as Settle takes it: build
// one with Limit.Micro.
type MicroLimit = limit.MicroLimit

// Errors for misuse, reported before Redis is touched. They are the same
// values as the other tiers use, so errors.Is matches across packages.
var (
	ErrInvalidLimit = limit.ErrInvalidLimit
	ErrInvalidCost  = limit.ErrInvalidCost
	ErrInvalidKey   = limit.ErrInvalidKey
)

// ErrReply means the script answered with something other than five
// integers in range. It is wrapped with the reply that was received.
var ErrReply = errors.New("garbled script reply")

// maxAmount bounds the micro-token amounts of a Settlement: the script
// computes with doubles, exact below 2^53.
const maxAmount = 1<<53 - 1

// Limiter reads and changes token buckets in Redis. It holds no state of its
// own besides its configuration and is safe for concurrent use. Create one
// with New.
type Limiter struct {
	rdb       Client
	prefix    string // Config.Prefix + ":{"
	fleetKey  string // Config.Prefix + ":fleet{fleet}"
	resetsKey string // Config.Prefix + ":resets{fleet}"
	// script is lua.Settle, sent by its hash (EVALSHA), and by its source
	// only to a node that answers NOSCRIPT. Not the source first, which
	// saves a new process's first call a round trip on a Redis that has
	// not run the script: a fleet that starts at once would send 34 KB in
	// every instance's first calls, to a Redis that needs it once, and the
	// calls, slower for it, time out (256 instances starting on one host,
	// 5 s: on a Redis with the script, 0 requests unanswered against 277
	// to 844; see docs/tuning.md). Limiter.Load (a service's Warm) saves
	// the round trip.
	script  *redis.Script
	fleet   *redis.Script // lua.Heartbeat
	witness *redis.Script // lua.Witness
	peek    *redis.Script // lua.Peek
	ahead   *redis.Script // lua.Ahead
	reset   *redis.Script // lua.Reset
}

// New returns a Limiter that keeps its buckets in rdb.
func New(rdb Client, cfg Config) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("global: nil client")
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("global: prefix %q contains '{' or '}'", prefix)
	}
	return &Limiter{
		rdb:       rdb,
		prefix:    prefix + ":{",
		fleetKey:  prefix + fleetSuffix,
		resetsKey: prefix + resetsSuffix,
		script:    redis.NewScript(lua.Settle),
		fleet:     redis.NewScript(lua.Heartbeat),
		witness:   redis.NewScript(lua.Witness),
		peek:      redis.NewScript(lua.Peek),
		ahead:     redis.NewScript(lua.Ahead),
		reset:     redis.NewScript(lua.Reset),
	}, nil
}

// Key returns the Redis key of the bucket for key: the prefix, ":{", key and
// "}". For a fixed prefix the encoding is injective: key is what lies between
// the prefix's ":{" and the final "}", whatever bytes it holds. Redis Cluster
// hashes the hash tag, what lies between the first '{' (the one after the
// prefix, which has no braces) and the first '}' after it. So the slot
// depends on key alone, and a key that contains '}' only changes which slot
// its bucket lands in, never which bucket it reaches.
func (l *Limiter) Key(key string) string {
	return l.prefix + key + "}"
}

// Result is the decision of Allow.
type Result struct {
	// Allowed reports whether the n tokens were taken.
	Allowed bool
	// Remaining is the whole tokens left in the bucket after the decision,
	// rounded down, never below 0.
	Remaining int64
	// RetryAfter is 0 if Allowed, else how long until n tokens are there.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full.
	ResetAfter time.Duration
	// Limit is the limit the decision was made against.
	Limit Limit
	// Now is the Redis time of the decision.
	Now time.Time
	// Reset reports that Redis held something unreadable under the key
	// (another type, or garbled fields) and that it was replaced with a
	// full bucket before the decision.
	Reset bool
}

// Allow takes n tokens from the bucket of key if they are all there, in one
// script call: the exact limiter, with one round trip per decision. If the
// script is not cached in Redis (after a restart or SCRIPT FLUSH) it is sent
// again. A denial is a Result, not an error; errors are for invalid
// arguments (ErrInvalidLimit, ErrInvalidCost, ErrInvalidKey, checked before
// Redis is touched), for Redis failing and for a reply wrapping ErrReply.
func (l *Limiter) Allow(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	s, err := Decision(key, lim, n)
	if err != nil {
		return Result{}, err
	}
	v, err := l.script.Run(ctx, l.rdb, []string{l.Key(key)}, s.args()...).Result()
	if errors.Is(err, redis.Nil) {
		err = fmt.Errorf("%w: got nil, want %d integers", ErrReply, replyLen)
	}
	if err != nil {
		return Result{}, fmt.Errorf("global: allow %q: %w", key, err)
	}
	r, err := parseReply(v, s.Limit.Burst, s.Want, 0, false)
	if err != nil {
		return Result{}, fmt.Errorf("global: allow %q: %w", key, err)
	}
	return Outcome(s, lim, r), nil
}

// Decision returns the Settlement that decides a request for n tokens of
// key under lim as Allow does, all or nothing, for a caller that sends it
// with others in one Settle; Outcome reads its Reply. Its errors are
// Allow's for invalid arguments.
func Decision(key string, lim Limit, n int64) (Settlement, error) {
	m, cost, err := check(key, lim, n)
	if err != nil {
		return Settlement{}, fmt.Errorf("global: allow %q: %w", key, err)
	}
	// want == min_grant == cost: all or nothing, with nothing to round.
	return Settlement{Key: key, Limit: m, Want: cost, MinGrant: cost, Quantum: 1}, nil
}

// Outcome returns the Result of Allow for rep, the Reply without an error of
// s, a Decision under lim.
func Outcome(s Settlement, lim Limit, rep Reply) Result {
	return result(rep, s.Limit, lim, s.Want)
}

// check validates the arguments of Allow.
func check(key string, lim Limit, n int64) (limit.MicroLimit, int64, error) {
	if err := limit.CheckKey(key); err != nil {
		return limit.MicroLimit{}, 0, err
	}
	m, err := lim.Micro()
	if err != nil {
		return limit.MicroLimit{}, 0, err
	}
	cost, err := m.Cost(n)
	if err != nil {
		return limit.MicroLimit{}, 0, err
	}
	return m, cost, nil
}

// result turns a script reply to a request for cost micro-tokens into a Result.
func result(r Reply, m limit.MicroLimit, lim Limit, cost int64) Result {
	res := Result{
		Allowed:    r.Granted == cost,
		Remaining:  max(r.Tokens, 0) / limit.Micro,
		ResetAfter: limit.DurationFor(m.Burst-r.Tokens, m.Rate),
		Limit:      lim,
		Now:        r.Now,
		Reset:      r.Reset,
	}
	if !res.Allowed {
		res.RetryAfter = limit.DurationFor(cost-r.Tokens, m.Rate)
	}
	return res
}

// replyLen is the integers of the script's reply a key.
const replyLen = 7

// parseReply reads the script's reply {granted, tokens, now_us, reset, dup,
// forgiven, credited} for a bucket of burst micro-tokens, a request of want and a
// charge of consumed, sent with a seq if dedup (a reply without one cannot
// be a duplicate). It never panics: anything else is an error wrapping
// ErrReply.
func parseReply(v any, burst, want, consumed int64, dedup bool) (Reply, error) {
	a, ok := v.([]any)
	if !ok {
		return Reply{}, fmt.Errorf("%w: got %T, want %d integers", ErrReply, v, replyLen)
	}
	if len(a) != replyLen {
		return Reply{}, fmt.Errorf("%w: got %d values, want %d integers", ErrReply, len(a), replyLen)
	}
	var x [replyLen]int64
	for i, e := range a {
		n, ok := e.(int64)
		if !ok {
			return Reply{}, fmt.Errorf("%w: value %d is %T, want an integer", ErrReply, i, e)
		}
		x[i] = n
	}
	return parseInts(&x, burst, want, consumed, dedup)
}

// parseInts is parseReply for a reply read as integers already.
func parseInts(x *[replyLen]int64, burst, want, consumed int64, dedup bool) (Reply, error) {
	granted, tokens, now, reset, dup, forgiven, credited := x[0], x[1], x[2], x[3], x[4], x[5], x[6]
	switch {
	case granted < 0 || granted > want:
		return Reply{}, fmt.Errorf("%w: granted %d is outside [0, %d]", ErrReply, granted, want)
	case tokens < -MaxDebt || tokens > burst:
		return Reply{}, fmt.Errorf("%w: tokens %d is outside [-2^50, %d]", ErrReply, tokens, burst)
	case now <= 0 || now > maxAmount: // Redis TIME is never 0; a nil read as an integer is
		return Reply{}, fmt.Errorf("%w: time %d µs is outside (0, 2^53)", ErrReply, now)
	case reset != 0 && reset != 1:
		return Reply{}, fmt.Errorf("%w: reset %d is neither 0 nor 1", ErrReply, reset)
	case dup < 0 || dup > 2:
		return Reply{}, fmt.Errorf("%w: dup %d is not 0, 1 or 2", ErrReply, dup)
	case dup != 0 && reset == 1:
		return Reply{}, fmt.Errorf("%w: dup %d with reset 1", ErrReply, dup)
	case dup != 0 && !dedup:
		return Reply{}, fmt.Errorf("%w: dup %d for a call without a seq", ErrReply, dup)
	case dup == 2 && granted != 0:
		return Reply{}, fmt.Errorf("%w: granted %d for a superseded duplicate", ErrReply, granted)
	case forgiven < 0 || forgiven > consumed || dup != 0 && forgiven != 0:
		return Reply{}, fmt.Errorf("%w: forgiven %d is outside [0, consumed %d], or not 0 for a duplicate", ErrReply, forgiven, consumed)
	case credited < 0 || credited > consumed-forgiven || dup != 0 && credited != 0:
		return Reply{}, fmt.Errorf("%w: credited %d is outside [0, consumed %d less forgiven %d], or not 0 for a duplicate", ErrReply, credited, consumed, forgiven)
	}
	return Reply{Granted: granted, Tokens: tokens, Now: time.UnixMicro(now), Reset: reset == 1, Duplicate: dup != 0, Superseded: dup == 2, Forgiven: forgiven, Credited: credited}, nil
}
