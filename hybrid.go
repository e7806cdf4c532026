// Package hybrid is a token-bucket rate limiter whose limits hold across a
// fleet of service instances, answered at in-process speed.
//
// Each instance keeps shadow buckets in memory that answer hot keys with no
// network hop. A background reconciler settles what they consumed, many keys
// per round trip, with an authoritative bucket per key in Redis, changed only
// by Lua scripts with Redis TIME as the clock. When Redis fails, a circuit
// breaker drops the limiter to a local fallback mode, and the consumption of
// the outage is settled when Redis is back.
//
// A limit is a rate, a burst and a settlement mode:
//
//   - Lease (the default) reserves allowance in Redis before it is spent
//     here: the fleet never admits more than the global bucket holds.
//   - Optimistic spends a local budget first and charges Redis at the next
//     round: no wait on a cold key, a bounded overshoot (docs/accuracy.md).
//   - Exact asks Redis for every decision: one script call each.
//
// A denial is a Result, not an error. Errors are for misuse (an invalid
// limit, a cost above the burst, an empty or oversized key) and for a closed
// Limiter.
package hybrid

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Mode is how a limit is settled with Redis: Lease, Optimistic or Exact.
type Mode = reconcile.Mode

// The settlement modes.
const (
	// Lease reserves allowance in Redis before it is spent: exact for the
	// fleet, with a round trip on a key's first request.
	Lease = reconcile.Lease
	// Optimistic spends first and settles at the next round: no wait, a
	// bounded overshoot.
	Optimistic = reconcile.Optimistic
	// Exact makes one Redis script call per decision.
	Exact = reconcile.Exact
)

// Limit is a token-bucket limit: Rate tokens per second refill a bucket that
// holds at most Burst tokens, settled in Mode. Rate is at least 1e-6 and at
// most 1e9; Burst is at least 1 and at most 1e9.
type Limit struct {
	Rate  float64
	Burst int64
	Mode  Mode
}

// Errors. A denial is not an error.
var (
	// ErrClosed is returned by a Limiter after Close.
	ErrClosed = errors.New("hybrid: limiter closed")
	// ErrInvalidLimit, ErrInvalidCost and ErrInvalidKey report misuse,
	// before any state is touched. They are the same values as in the
	// packages global and local.
	ErrInvalidLimit = limit.ErrInvalidLimit
	ErrInvalidCost  = limit.ErrInvalidCost
	ErrInvalidKey   = limit.ErrInvalidKey
	// ErrWouldWait is returned by Wait when the context's deadline comes
	// before the tokens could.
	ErrWouldWait = errors.New("hybrid: wait would exceed the context deadline")
	// ErrUnavailable is returned by Reset while the key's Redis is down
	// (its breaker open): a reset needs Redis, and never does nothing
	// silently.
	ErrUnavailable = errors.New("hybrid: Redis is unavailable")
)

// Config configures a Limiter. A zero field means its documented default, so
// the zero Config is ready to use.
type Config struct {
	// Prefix starts every Redis key. "" means "hybrid".
	Prefix string
	// SyncInterval is the time between two settlement rounds. 0 means 100ms.
	SyncInterval time.Duration
	// FirstRound is how long after New the first settlement round comes;
	// the others follow every SyncInterval. 0 means a random moment within
	// the first SyncInterval, so that a fleet started at once does not
	// settle all at once. Tests that run in fake time (testing/synctest)
	// and check what a round did at an interval's end set it to
	// SyncInterval; more than SyncInterval means SyncInterval.
	FirstRound time.Duration
	// LocalCapacity bounds, in tokens, what one instance holds for one key
	// without asking Redis: its lease in Lease mode, its budget in Optimistic
	// mode. It trades Redis load (about one command per LocalCapacity
	// tokens on a hot key) against how much of a limit one instance can
	// hold (never more than the burst, and leases are sized to use).
	// 0 means 4096.
	LocalCapacity int64
	// MaxKeys bounds the keys tracked in memory; the least recently used
	// are settled and dropped. 0 means 100000.
	MaxKeys int
	// ColdWait bounds how long a request waits for Redis, in all: for a
	// settlement round that holds its key (an Optimistic key's charge, a
	// lease that round may grant), its fetches, a take, an Exact decision.
	// Past it the request is denied, or answered by the fallback policy
	// if Redis is known to be down. 0 means the breaker's call timeout
	// (50ms). A Redis whose round trips take longer (far away, or busy)
	// needs a ColdWait above them.
	ColdWait time.Duration
	// Instances is the fleet size for LocalShare. 0 means the live count
	// from the instances' heartbeats through Redis.
	Instances int
	// InstanceID names this instance in the heartbeats. "" means random.
	InstanceID string
	// Fallback decides while Redis is unreachable. The zero value is
	// LocalShare.
	Fallback Fallback
	// MaxDebt bounds what an outage may leave a key owing, as time of the
	// key's refill. When Redis is back, what the fallback admitted (and
	// what Redis lost of its writes, charged again) is charged down to
	// -max(Burst, Rate * MaxDebt) tokens at most: the key admits nothing
	// more until its refill has paid that back, and the rest is forgiven.
	// 0 means a minute (reconcile.DefaultMaxDebt), which charges in full
	// what any outage admits under LocalShare (whose charges claim back
	// the refill Redis's bucket lost while it could not see them, so that
	// the bucket ends the outage where it would have had it seen every
	// admission) and a minute's worth of FailOpen; a duration up to the
	// burst's refill means the burst alone (docs/accuracy.md, "Outages
	// and the debt").
	MaxDebt time.Duration
	// RefillPace is how much of a saturated key's refill an instance asks
	// Redis for at once, as time of the key's rate: a key whose demand
	// exceeds its rate costs the fleet about one Redis call per
	// RefillPace, whatever that demand, and its tokens come in lumps of
	// RefillPace's refill (at most half the burst). The default suits a
	// service that waits for its tokens (Wait, RetryAfter): a saturated
	// key's requests are let through within about 1 ms of when their
	// tokens are due. A proxy's limits, which deny rather than wait, may
	// take a longer pace for fewer calls: at 50ms (the shortest refill
	// Envoy's own local rate limit takes), a key of 10,000/s costs Redis
	// about 20 calls a second, against 300 to 450 at 1ms (a key of
	// 1,000/s, about 20 against 900: docs/tuning.md, "The refill pace").
	// 0 means 1ms.
	RefillPace time.Duration
	// Breaker configures the circuit breaker around the Redis calls. On a
	// Redis Cluster each master gets a breaker of its own with this
	// configuration, so that a master that fails sends only its own keys
	// to the fallback while the others keep settling.
	Breaker breaker.Config
	// Logger receives the Limiter's log lines: a warning when Redis becomes
	// unreachable, or refuses every call (full: maxmemory; a read-only
	// replica; a refused client, named by its cause), and the fallback
	// policy takes over, an info line when it is back; failing settlement
	// rounds (the first failure, then at most one line every 10s with a
	// count, then their recovery); Close.
	// Nothing is logged on a decision answered locally. Nil means no
	// logging. go-redis keeps a logger of its own (for refused dials, say):
	// silence it with redis.SetLogger (docs/observability.md).
	Logger *slog.Logger
}

// Limiter is a fleet-wide rate limiter. It is safe for concurrent use.
// Create one with New and stop it with Close.
type Limiter struct {
	g     *global.Limiter
	r     *reconcile.Reconciler
	keys  *local.Store[reconcile.State]
	clock local.Clock
	fb    Fallback
	stats counters
	// ledger remembers the fallback's local buckets of keys whose entries
	// left the store (see seed and left).
	ledger *local.Ledger
	// maxOrphans bounds the keys the instance owes Redis for without an
	// entry, beyond which the fallback admits no key that owes nothing
	// yet: as many as the ledger remembers.
	maxOrphans int

	specs  sync.Map // Limit -> *reconcile.Spec, interned
	nspecs atomic.Int64

	lastYield atomic.Int64 // clock reading of the last yield of a denial (see yield)
	waits     waitLines    // the keys WaitN calls wait on
	unwatch   func()       // stops telling the breakers of refused dials (global.WatchDials)
}
