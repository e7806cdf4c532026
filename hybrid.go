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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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
	// ColdWait bounds how long a request waits for Redis on a key this
	// instance holds nothing for; past it the fallback policy answers.
	// 0 means the breaker's call timeout (50ms). A request whose key a
	// settlement round holds (an Optimistic key's charge, a lease that
	// round may grant) waits for that round first, while it makes progress:
	// a call of it answered at least every two of the breaker's deadlines
	// for a full call, which adapt to the latency Redis shows.
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
}

// New returns a Limiter that keeps its global buckets in rdb (a standalone
// Redis, Sentinel or Redis Cluster client) and starts its reconciler. The
// client the service uses already will do: a settlement its own retries
// send again is applied once, or, for a decision, errs towards denying. It
// should have ContextTimeoutEnabled, so that the limiter's call deadlines
// reach the socket; New logs one warning on cfg.Logger when a client whose
// options it can read does not.
func New(rdb redis.UniversalClient, cfg Config) (*Limiter, error) {
	g, err := global.New(rdb, global.Config{Prefix: cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	if err := cfg.Fallback.check(); err != nil {
		return nil, err
	}
	checkClient(rdb, cfg.Logger)
	size := ledgerSize(cfg.MaxKeys)
	l := &Limiter{g: g, fb: cfg.Fallback, ledger: local.NewLedger(size), maxOrphans: size}
	r, err := reconcile.New(g, reconcile.Config{
		SyncInterval:  cfg.SyncInterval,
		FirstRound:    cmp.Or(cfg.FirstRound, firstRound(cmp.Or(cfg.SyncInterval, reconcile.DefaultSyncInterval))),
		LocalCapacity: cfg.LocalCapacity,
		MaxKeys:       cfg.MaxKeys,
		ColdWait:      cfg.ColdWait,
		MaxDebt:       cfg.MaxDebt,
		ShareCredit:   cfg.Fallback.kind == localShare,
		Instances:     cfg.Instances,
		InstanceID:    cfg.InstanceID,
		Breaker:       cfg.Breaker,
		Logger:        cfg.Logger,
		OnLeave:       func(e *reconcile.Entry, pending int64) { l.left(e, pending) },
		Ledger:        l.ledger,
	})
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	l.r, l.keys, l.clock = r, r.Keys(), r.Clock()
	return l, nil
}

// firstRound draws when a new Limiter's first settlement round comes when
// Config.FirstRound is 0: at random within the sync interval si, so that a
// fleet started at once settles at as many moments as it has instances.
var firstRound = func(si time.Duration) time.Duration {
	if si <= 0 {
		return 0 // an invalid interval, which New reports
	}
	return 1 + time.Duration(rand.Int64N(int64(si)))
}

// Allow reports whether one token may be taken for key under lim now. It is
// AllowN(ctx, key, lim, 1).
func (l *Limiter) Allow(ctx context.Context, key string, lim Limit) (Result, error) {
	return l.AllowN(ctx, key, lim, 1)
}

// AllowN decides whether n tokens may be taken for key under lim now, and
// takes them if so. On a key this instance holds allowance for, it reads no
// clock, takes no lock and allocates nothing. On a key it holds nothing for,
// it may wait for Redis (at most Config.ColdWait, and not past ctx).
//
// A changed lim for a key takes effect at once. A denial is a Result with
// Allowed false; errors are for an invalid key, limit or cost, a done ctx
// and a closed Limiter.
func (l *Limiter) AllowN(ctx context.Context, key string, lim Limit, n int64) (res Result, err error) {
	e := l.keys.Get(key)
	if _, ok := l.fast(&res, key, lim, n, e); ok {
		return res, nil
	}
	res, _, err = l.slow(ctx, key, lim, n, e)
	return res, err
}

// decide is AllowN that also returns the entry the decision was made on. e
// is the key's entry as looked up already, or nil.
func (l *Limiter) decide(ctx context.Context, key string, lim Limit, n int64, e *reconcile.Entry) (res Result, _ *reconcile.Entry, err error) {
	if e, ok := l.fast(&res, key, lim, n, e); ok {
		return res, e, nil
	}
	return l.slow(ctx, key, lim, n, e)
}

// fast decides from e's allowance alone, if it holds the tokens, into res:
// ok is false, with res untouched, when the decision needs more (slow). e
// is the key's entry as looked up already, or nil; the returned entry is the
// one the decision was made on, nil if it left the store meanwhile. It is
// the hot path of every entry point: it reads no clock, takes no lock and
// allocates nothing, and it writes the Result in the caller's place.
func (l *Limiter) fast(res *Result, key string, lim Limit, n int64, e *reconcile.Entry) (_ *reconcile.Entry, ok bool) {
	if e == nil {
		return nil, false
	}
	sp := e.X.Spec()
	if sp == nil || sp.Mode == Exact || !sp.Is(lim.Rate, lim.Burst, lim.Mode) || n < 1 || n > sp.Limit.Burst/local.Micro {
		return nil, false
	}
	if sp.Mode == Lease {
		// The spend is inlined and comes before any call: Go stores what a
		// call outlives before the first call, and the spend's atomic
		// instruction waits for earlier stores (3 ns of a 25-ns decision;
		// a stripe's spend likewise).
		w := e.Allowance.Spender() // its own word, or a stripe once contended
		left, ok := w.TrySpend(n * local.Micro)
		if !ok {
			return l.fastShared(res, lim, n*local.Micro, e, sp)
		}
		return l.leased(res, lim, left+e.Allowance.Besides(w), e, sp)
	}
	left, ok := e.Allowance.SpendLeft(n * local.Micro)
	if !ok {
		return nil, false
	}
	kept := e.Pending.Add(n * local.Micro)
	l.allowedIn(res, e, sp, lim, left, SourceLocal) // with n unsettled
	if kept {
		return e, true
	}
	// The entry left the store between the two: its budget was spent, the
	// consumption must still be charged.
	l.orphan(e, sp, n*local.Micro)
	return nil, true
}

// fastShared is fast's lease spend when the uncontended one failed: the
// allowance is striped, contended, or short.
func (l *Limiter) fastShared(res *Result, lim Limit, cost int64, e *reconcile.Entry, sp *reconcile.Spec) (*reconcile.Entry, bool) {
	left, ok := e.Allowance.SpendLeftShared(cost) // striped once contended
	if !ok {
		return nil, false
	}
	return l.leased(res, lim, left, e, sp)
}

// leased is fast's decision once a lease's tokens are spent, leaving left
// micro-tokens in e's allowance: it asks for more before it runs dry, and
// writes the Result.
func (l *Limiter) leased(res *Result, lim Limit, left int64, e *reconcile.Entry, sp *reconcile.Spec) (*reconcile.Entry, bool) {
	if left < l.r.LowWater(e) {
		l.r.Starved(e, true) // top it up before it runs dry
	}
	l.allowedIn(res, e, sp, lim, left, SourceLocal)
	return e, true
}

// spend takes n micro-tokens from e's allowance: a lease's shared, striped
// across the cores once they contend for it; an optimistic budget's from its
// one word, which each round replaces whole (local.Allowance.Update).
func spend(e *reconcile.Entry, sp *reconcile.Spec, n int64) (left int64, ok bool) {
	if sp.Mode == Lease {
		return e.Allowance.SpendLeftShared(n)
	}
	return e.Allowance.SpendLeft(n)
}

// slow is the path of a key without enough allowance, a new key, a changed
// limit, an Exact limit, or fallback mode. e is the key's entry as looked up
// already, or nil.
func (l *Limiter) slow(ctx context.Context, key string, lim Limit, n int64, e *reconcile.Entry) (Result, *reconcile.Entry, error) {
	var sp *reconcile.Spec
	if e != nil { // a valid key: skip its checks
		if esp := e.X.Spec(); esp != nil && esp.Is(lim.Rate, lim.Burst, lim.Mode) {
			sp = esp
		}
	} else if err := limit.CheckKey(key); err != nil {
		return Result{}, nil, fmt.Errorf("hybrid: %w", err)
	}
	if sp == nil {
		var err error
		if sp, err = l.spec(lim); err != nil {
			return Result{}, nil, fmt.Errorf("hybrid: key %q: %w", key, err)
		}
	}
	cost, err := sp.Limit.Cost(n)
	if err != nil {
		return Result{}, nil, fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	if l.r.Closed() {
		return Result{}, nil, ErrClosed
	}
	// The caller's lookup missed the key (or it made none).
	missed := e == nil
	for range 3 { // an entry may be retired under us: look the key up again
		switch {
		case missed:
			e, _ = l.keys.Add(key)
			missed = false
		case e == nil || e.Retired():
			e, _ = l.keys.GetOrAdd(key)
		}
		if e.X.Spec() != sp {
			l.setSpec(e, sp)
		}
		res, ok, err := l.decideSlow(ctx, e, sp, lim, cost)
		if err != nil {
			return Result{}, nil, err
		}
		if ok {
			return res, e, nil
		}
		e = nil
	}
	// The store is churning faster than this key can keep an entry.
	res, err := l.alone(ctx, key, sp, lim, cost)
	return res, nil, err
}

// decideSlow decides for e. ok is false if e was retired meanwhile.
func (l *Limiter) decideSlow(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (res Result, ok bool, err error) {
	if e.Retired() {
		return Result{}, false, nil
	}
	if sp.Mode == Exact {
		return l.exact(ctx, e, sp, lim, cost)
	}
	if left, ok := spend(e, sp, cost); ok {
		if sp.Mode == Optimistic && !e.Pending.Add(cost) {
			l.orphan(e, sp, cost)
		}
		return l.allowed(e, sp, lim, left, SourceLocal), true, nil
	}
	if l.r.DegradedKey(e.Key()) {
		return l.fallback(e, sp, lim, cost, e.Key()), true, nil
	}
	if sp.Mode == Optimistic {
		return l.optimistic(ctx, e, sp, lim, cost)
	}
	now := l.clock.Now()
	if res, ok := l.reserved(e, sp, lim, cost, now); ok {
		return res, true, nil
	}
	fresh, res, denied := l.heldBack(e, sp, lim, cost, now)
	if denied {
		return res, true, nil
	}
	// Lease, and Redis may have tokens: fetch them. A fetch is shared with
	// the concurrent requests for the key; while Redis still has tokens
	// after it, the ones it did not cover fetch again with a larger lease,
	// and at last take their cost for themselves.
	l.stats.fetched.Add(1)
	if fresh { // a key in use whose lease ran dry: it grows
		l.r.Starved(e, false)
	}
	// The fetches ask for what all their waiters need: a request counts
	// its need in once it is to wait for a fetch of another's (one is on
	// its way), or to fetch again. A request alone on its key (the long
	// tail's every request) asks for its cost alone, and counts nothing.
	counted := false
	for i := range maxFetches {
		if !counted && (i > 0 || l.r.Fetching(e)) {
			counted = true
			l.r.AddDemand(e, cost)
			defer l.r.AddDemand(e, -cost)
		}
		if err := l.r.Fetch(ctx, e, cost); err != nil {
			return l.fetchFailed(ctx, err, e, sp, lim, cost)
		}
		if left, ok := e.Allowance.SpendUncounted(cost); ok { // fetched for it: not a local decision
			return l.allowed(e, sp, lim, left, SourceRedis), true, nil
		}
		if res, ok := l.reserved(e, sp, lim, cost, l.clock.Now()); ok {
			return res, true, nil // its turn, taken ahead, is not due yet
		}
		if e.Retired() {
			return Result{}, false, nil
		}
		if e.View().Tokens < cost {
			break
		}
		l.r.Starved(e, false) // the next fetch asks for a larger lease
	}
	if e.View().Tokens >= cost {
		// Other requests spent what the fetches brought: take this one's
		// cost for it alone.
		ok, err := l.r.Take(ctx, e, cost)
		if ok {
			return l.allowed(e, sp, lim, e.Allowance.Load(), SourceRedis), true, nil
		}
		if err != nil && ctx.Err() != nil {
			return Result{}, false, ctx.Err()
		}
		if errors.Is(err, reconcile.ErrGone) {
			return Result{}, false, nil // evicted meanwhile: look it up again
		}
	}
	// A settlement round for the key may be under way, and may be what
	// emptied the bucket for the fetches: wait for its grant before denying.
	if l.r.AwaitRound(ctx, e) {
		if left, ok := e.Allowance.SpendUncounted(cost); ok {
			return l.allowed(e, sp, lim, left, SourceRedis), true, nil
		}
		if ctx.Err() != nil {
			return Result{}, false, ctx.Err()
		}
	}
	l.r.Starved(e, false)
	l.stats.redisDenied.Add(1)
	held, v := e.Allowance.Load(), e.View()
	return l.denied(sp, lim, untilHolds(sp, v, cost-held, l.clock.Now()), v, held, SourceRedis), true, nil
}

// reserved decides a lease request of cost micro-tokens for e, which holds
// too little allowance for it, from the turn e's key took ahead, if it has
// one (see reconcile.Reconciler.Ahead): ok is true when it decided, and res
// is the decision. A turn not yet due denies the request until it is.
func (l *Limiter) reserved(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, now time.Duration) (res Result, ok bool) {
	wait, has := l.r.Reserved(e, now)
	if !has {
		return Result{}, false
	}
	if wait == 0 {
		if left, ok := e.Allowance.SpendUncounted(cost); ok {
			return l.allowed(e, sp, lim, left, SourceRedis), true
		}
		return Result{}, false // spent by others already: fetch
	}
	return l.deniedHere(sp, lim, wait, e.View(), e.Allowance.Load(), now), true
}

// heldBack decides a lease request of cost micro-tokens for e, which holds
// too little allowance for it, from e's view of the global bucket, when the
// view is fresh (see reconcile.Reconciler.Fresh): denied is true when the
// request is denied here, without a round trip, and res is the denial.
// fresh reports whether the view was.
func (l *Limiter) heldBack(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, now time.Duration) (fresh bool, res Result, denied bool) {
	v := e.View()
	if v.Seen == 0 || v.Age(now) > l.r.Fresh(e, sp) {
		return false, Result{}, false
	}
	// The fleet's bucket, as last seen and refilled since, cannot yet hold
	// what a fetch would need (cost less the lease, or for a saturated key
	// more: this instance's turn; see reconcile.Reconciler.Due): deny here,
	// until then.
	held := e.Allowance.Load()
	if l.r.Ahead(e, sp) {
		// Its turn is taken ahead, and spent when it is due: a fetch now.
		return true, Result{}, false
	}
	if wait := untilHolds(sp, v, l.r.Due(e, sp, v, cost-held), now) - l.r.Lead(); wait > viewSlack {
		l.r.Starved(e, false)
		return true, l.deniedHere(sp, lim, wait, v, held, now), true
	}
	if l.r.Fetching(e) && l.r.Refill(sp, l.r.SyncInterval()) <= sp.Limit.Burst &&
		v.Tokens+l.r.Refill(sp, v.Age(now)) < l.r.Takers(e)*l.r.LeaseSize(e, sp)+cost {
		// A fetch is on its way, and the fleet's fetches may take all the
		// bucket holds (a lease each): one request waits for it, the others
		// are told to retry when it is back, a round trip from now, rather
		// than queue behind it (a hot key's callers would wait on round
		// trips instead of being answered here). Not for a key whose burst
		// is below an interval's refill: its callers wait, blocked, so that
		// the fetch's reply is not kept from a core by their denials while
		// the bucket, full, refills nothing.
		l.r.Starved(e, false)
		return true, l.deniedHere(sp, lim, 2*l.r.Lead(), v, held, now), true
	}
	return true, Result{}, false
}

// lease returns the allowance e holds in lease mode, in micro-tokens: tokens
// of the global bucket reserved for this instance. 0 in the other modes,
// whose allowance is a budget (optimistic) or nothing.
func (l *Limiter) lease(e *reconcile.Entry, sp *reconcile.Spec) int64 {
	if sp.Mode != Lease {
		return 0
	}
	return e.Allowance.Load()
}

// maxFetches bounds the shared fetches one request waits for.
const maxFetches = 3

// spec returns the interned spec of lim, validating it the first time. A
// known limit is found without a lock.
func (l *Limiter) spec(lim Limit) (*reconcile.Spec, error) {
	if sp, ok := l.specs.Load(lim); ok {
		return sp.(*reconcile.Spec), nil
	}
	sp, err := reconcile.NewSpec(lim.Rate, lim.Burst, lim.Mode)
	if err != nil {
		return nil, err
	}
	if l.nspecs.Add(1) > maxSpecs { // a caller minting limits: do not grow forever
		l.specs.Clear()
		l.nspecs.Store(1)
	}
	v, _ := l.specs.LoadOrStore(lim, sp)
	return v.(*reconcile.Spec), nil
}

// maxSpecs bounds the interned specs.
const maxSpecs = 4096

// setSpec gives e its spec, once per change even when callers race: what
// e holds under an old limit is let go (a lease goes back to Redis; an
// optimistic budget was never reserved and is dropped), and an optimistic
// key gets its first budget. The spec is published last, so the hot path
// never spends under the new limit before the entry is ready for it.
func (l *Limiter) setSpec(e *reconcile.Entry, sp *reconcile.Spec) {
	e.X.LockSpec()
	defer e.X.UnlockSpec()
	old := e.X.Spec()
	if old == sp {
		return // set by a caller we raced with
	}
	if old != nil && (old.Limit != sp.Limit || old.Mode != sp.Mode) {
		if back := e.Allowance.TakeAll() + l.r.TakeReserved(e); back > 0 && old.Mode == Lease {
			l.r.Return(e.Key(), old, back)
		}
	}
	if v := e.View(); v.Seen != 0 && sp.Mode == Optimistic && (old == nil || old.Limit != sp.Limit || old.Mode != sp.Mode) {
		// A known bucket under a new limit: a budget from what it held.
		// A key with no view gets its first budget from Redis, at its
		// first request.
		e.Allowance.Add(l.r.Budget(sp, min(v.Tokens-l.r.Unsettled(e), sp.Limit.Burst), 0, 0))
	}
	e.X.SetSpec(sp)
}

// Close stops the reconciler, waits for it, and settles every key for the
// last time within ctx: leases go back, consumption is charged. Decisions
// after Close return ErrClosed. Close is idempotent.
func (l *Limiter) Close(ctx context.Context) error {
	if err := l.r.Close(ctx); err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	return nil
}
