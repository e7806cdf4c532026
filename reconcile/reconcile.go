// Package reconcile settles the shadow buckets of one limiter instance with
// the authoritative buckets in Redis. It owns the limiter's only background
// goroutine: every SyncInterval, and early when a hot key's allowance runs
// dry, it settles every key touched since the last round in one pipelined
// round trip per Redis node, and applies the answers to the shadow buckets.
// It also fetches cold keys (concurrent first requests share one fetch),
// counts the live instances of the fleet through Redis heartbeats, and keeps
// the circuit breaker that decides when the limiter falls back to local mode.
package reconcile

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// Store is the Redis side, as the reconciler uses it. *global.Limiter
// implements it.
type Store interface {
	Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (live int, now time.Time, err error)
	Leave(ctx context.Context, id string, ttl time.Duration) (live int, err error)
}

// Defaults of Config.
const (
	DefaultSyncInterval      = 100 * time.Millisecond
	DefaultLocalCapacity     = 4096
	DefaultHeartbeatInterval = time.Second
	DefaultMaxDebt           = time.Minute
	DefaultRefillPace        = time.Millisecond
)

// Config configures a Reconciler. A zero field means its documented default.
type Config struct {
	// SyncInterval is the time between two settlement rounds. A round also
	// starts early when a key's allowance runs dry, but never sooner than
	// SyncInterval/4 after the previous one. 0 means 100ms.
	SyncInterval time.Duration
	// FirstRound is how long after New the first settlement round comes;
	// the others follow every SyncInterval. A fleet whose instances drew
	// it at random within a SyncInterval (hybrid.New does) settles at as
	// many moments as it has instances, not all at once: started together
	// (a deploy, a bench), their rounds would otherwise reach Redis
	// together every SyncInterval, and a busy Redis would answer the last
	// of them late. 0, or more than SyncInterval, means SyncInterval.
	FirstRound time.Duration
	// LocalCapacity bounds, in tokens, the allowance one instance holds for
	// one key: in lease mode what it reserves ahead, in optimistic mode the
	// budget it may spend before it settles. 0 means 4096.
	LocalCapacity int64
	// MaxKeys bounds the keys tracked. 0 means local.DefaultCapacity.
	MaxKeys int
	// ColdWait bounds how long a request waits for Redis in all: for the
	// round charging its key, if one is (see AwaitRound), its fetches, a
	// take (see ColdBy). 0 means the breaker's call timeout.
	ColdWait time.Duration
	// Instances is the fleet size used to share a limit while Redis is
	// unreachable. 0 means the live count from the heartbeats.
	Instances int
	// InstanceID names this instance in the heartbeats. "" means random.
	InstanceID string
	// MaxDebt bounds what a charge may leave a key owing, as time of the
	// key's refill: consumption that Redis did not see as it happened
	// (what the fallback admitted during an outage, writes Redis lost and
	// is charged again) sinks the bucket down to -max(burst, rate *
	// MaxDebt) at most, and the key admits nothing more until its refill
	// has paid that back; beyond it, the rest is forgiven. 0 means
	// DefaultMaxDebt, a minute; any duration up to the burst's refill
	// means the burst alone.
	MaxDebt time.Duration
	// RefillPace is how much of a saturated key's refill is asked of
	// Redis at once: an instance alone on a lease or optimistic key whose
	// allowance ran dry waits until the bucket has refilled RefillPace's
	// worth of it (see Pace), and the instances that share a lease key
	// take turns of 2·RefillPace's refill (see Due), so that a saturated
	// key costs the fleet about one call per RefillPace, whatever its
	// demand. Larger, such a key costs Redis fewer calls, and its tokens
	// come in lumps of as much refill: a request waits for one (Wait, a
	// RetryAfter) up to RefillPace longer than its token was due. The
	// lumps are bounded as before, by half the burst and by the lease.
	// 0 means DefaultRefillPace, 1ms.
	RefillPace time.Duration
	// ShareCredit reports that the fallback's local buckets are this
	// instance's shares of the global ones (hybrid.LocalShare): what they
	// admitted is charged with a claim of the refill they kept by being
	// spent (see charge), so that the fleet's shares and a bucket in Redis
	// that saw none of their admissions do not both count the outage's
	// refill.
	ShareCredit bool
	// OnLeave, if set, receives every entry that leaves the store (evicted,
	// removed, or drained at Close), retired, with the consumption it had
	// not settled (micro-tokens, which the reconciler charges later): what
	// the fallback would know of the key is lost with it, unless the owner
	// keeps it (hybrid's ledger of its evicted keys' shares). It runs on
	// the goroutine that caused the eviction, with no lock held.
	OnLeave func(e *Entry, pending int64)
	// Ledger, if set, is told when the local bucket of every entry that
	// leaves the store is full again, as it leaves (local.Config.Ledger).
	Ledger *local.Ledger
	// HeartbeatInterval is the time between two heartbeats; an instance
	// not heard from for three of them is no longer counted. 0 means 1s.
	HeartbeatInterval time.Duration
	// Breaker configures the circuit breakers around the Redis calls: one
	// for a single Redis; on a Redis Cluster (a Store that is a Router) one
	// per node besides, named after the node, so that a node that fails
	// sends only its own keys to the fallback. OnStateChange, if set, is
	// called after the reconciler's own, for every breaker's changes.
	Breaker breaker.Config
	// Logger receives the reconciler's few log lines: breaker transitions,
	// failing settlement rounds (the first, then at most one line per
	// logEvery while they go on, with a count) and their recovery, and
	// Close. They are written from the reconciler's goroutines, never from
	// a decision that is answered locally. Nil means no logging.
	Logger *slog.Logger
}

// ErrClosed is returned by a closed Reconciler.
var ErrClosed = errors.New("reconcile: closed")

// ErrGone is returned by Fetch and Take for an entry that has left the store
// (evicted, or retired by a limit change): the caller should look the key up
// again rather than decide without Redis.
var ErrGone = errors.New("reconcile: entry gone")

// ErrNoAnswer is returned by Fetch and Take when Redis did not answer
// within Config.ColdWait: the round trip may still be under way.
var ErrNoAnswer = errors.New("reconcile: no answer")

// Slow reports whether err, from Fetch, Take or Do, means that Redis did not
// answer in time (ErrNoAnswer, a call's deadline, a network timeout) rather
// than that it refused or failed the call: a Redis that is slow or busy,
// which is not down until its breaker says so.
func Slow(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrNoAnswer) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("reconcile: invalid config")

// Reconciler settles one instance's shadow buckets with Redis. It is safe for
// concurrent use. Create one with New; Close stops its goroutine.
type Reconciler struct {
	st          Store
	router      Router // st as a Router whose buckets are spread, or nil
	keys        *local.Store[State]
	clock       local.Clock
	cfg         Config
	lc          int64 // LocalCapacity in micro-tokens
	gap         time.Duration
	callTimeout time.Duration // the breakers' call timeout, which bounds a node lookup too

	// The Redis nodes, each with its breaker: def for a single Redis and
	// for keys whose node is not known, and those of a Redis Cluster by
	// address (copied on write under nodeMu).
	def       *node
	nodes     atomic.Pointer[map[string]*node]
	nodeMu    sync.Mutex
	ndegraded atomic.Int32 // nodes whose breaker is not closed
	// settleUntil is the latest of the nodes' settleUntil (see settleUp).
	settleUntil atomic.Int64
	// markUntil is the latest of the nodes' markUntil (see settleUp).
	markUntil atomic.Int64
	// lastOpened is the clock reading at which a breaker last left the
	// closed state (see outageOf).
	lastOpened atomic.Int64

	closing atomic.Bool  // Close was called (closed, under mu, is what goOwned checks)
	live    atomic.Int64 // fleet size for the fallback share
	// fewerSince is when the heartbeats began to count fewer instances than
	// live, 0 if the last one did not (loop goroutine only).
	fewerSince time.Duration
	beats      atomic.Int64 // heartbeats made by the loop
	// lastReset is the Redis time, in ms, of the latest reset of a bucket
	// this instance knows of, and resetSeen when it learned of it, on its
	// clock (see NoteReset).
	lastReset, resetSeen atomic.Int64
	// beatFlight shares the recounts of a young instance's first fetches.
	beatFlight singleflight.Group
	// counted is closed once the first heartbeat has answered or failed.
	counted     chan struct{}
	countedOnce sync.Once
	early       chan struct{}
	applied     atomic.Pointer[chan struct{}] // closed, and replaced, when a call's replies have been applied
	sides       sides                         // the entries' demands and prepaid grants
	flights     flights                       // the keys' fetches on their way (see Fetch)
	hurry       hurry                         // the keys whose requests wait for the round on its way (see awaitRound)
	inline      gate                          // the fetches made on their requests' goroutines (see leadFetch)
	evicted     evictions                     // the keys that left the store lately
	stats       counters

	log *slog.Logger

	mu             sync.Mutex // protects orphans, fetchDoubts, spare, orphanConsumed, low and closed
	orphans        map[string]orphan
	fetchDoubts    map[string]doubt  // by key, the last fetch whose reply was lost: the key's next fetch or round sends it again
	nfetchDoubts   atomic.Int64      // len(fetchDoubts), for a fetch to skip r.mu when it is 0
	spare          map[string]orphan // an empty map for the next swap of orphans, or nil
	orphanConsumed int64             // the sum of the orphans' consumed
	norphans       atomic.Int64      // len(orphans), written under mu
	low            []*Entry          // leases that ran low, for the next early round
	closed         bool

	stop    context.CancelFunc
	done    <-chan struct{} // closed by stop
	waiters sync.Pool       // of *waiter, for SettleNow (one Reconciler's: a waiter's channel is its)
	timers  sync.Pool       // of *time.Timer, stopped: see timer
	wg      sync.WaitGroup  // the loop and cold fetches

	// Owned by the loop goroutine (and Close, once the loop is gone).
	batch    []*Entry
	held     []*Entry
	sets     []global.Settlement
	owners   []owner // owners[i] is whose sets[i] is
	replies  []global.Reply
	ends     []time.Duration // ends[i] is when the reply to sets[i] came
	dedup    string          // Settlement.Instance: random, this Reconciler's alone
	seq      int64           // the last Settlement.Seq given
	fetchID  string          // Settlement.Instance of the fetches: dedup + ".f"
	fetchSeq atomic.Int64    // the last Seq given to a fetch
	journal  journal         // what the settlements took lately (losses.go)
	lossMu   sync.Mutex      // serialises witnessed
	// lastBeats is the last beat handled, by witness: "" for the
	// heartbeat's, a node's probe key for a node's (witness.go), under
	// lossMu.
	lastBeats   map[string]beat
	serverAsked bool            // the server that answers a single Redis's heartbeat was asked for its name (see askServer), under lossMu
	doubts      []doubt         // settlements without a reply, to send again
	inDoubt     map[string]bool // their keys, while a round sends them again
	inDoubtPeak int             // the most keys inDoubt has held since it was made
	resends     int             // the first resends of sets are doubts sent again
	groups      []*group        // the nodes of a round's keys
	failing     failing         // the rounds failing in a row, for the log
}

// orphan is what a key that left the store still owes Redis, or Redis owes
// it: consumption to charge and allowance to give back.
type orphan struct {
	spec               *Spec
	consumed, returned int64
	// shallow charges the orphan down to -burst at most, whatever
	// MaxDebt: it holds what a node that lost all its data lost (see
	// witnessedOn).
	shallow bool
}

// New returns a Reconciler for st and starts its goroutine. The shadow
// buckets it settles are in Keys.
func New(st Store, cfg Config) (*Reconciler, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	if cfg.SyncInterval < 0 || cfg.FirstRound < 0 || cfg.LocalCapacity < 0 || cfg.ColdWait < 0 || cfg.Instances < 0 || cfg.HeartbeatInterval < 0 || cfg.MaxKeys < 0 || cfg.MaxDebt < 0 || cfg.RefillPace < 0 {
		return nil, fmt.Errorf("%w: negative field in %+v", ErrConfig, cfg)
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if cfg.FirstRound == 0 || cfg.FirstRound > cfg.SyncInterval {
		cfg.FirstRound = cfg.SyncInterval
	}
	if cfg.LocalCapacity == 0 {
		cfg.LocalCapacity = DefaultLocalCapacity
	}
	if cfg.LocalCapacity > 1<<31 {
		return nil, fmt.Errorf("%w: LocalCapacity %d above 2^31", ErrConfig, cfg.LocalCapacity)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.MaxDebt == 0 {
		cfg.MaxDebt = DefaultMaxDebt
	}
	if cfg.RefillPace == 0 {
		cfg.RefillPace = DefaultRefillPace
	}
	if cfg.ColdWait == 0 {
		cfg.ColdWait = cfg.Breaker.CallTimeout
		if cfg.ColdWait == 0 {
			cfg.ColdWait = breaker.DefaultCallTimeout
		}
	}
	if cfg.InstanceID == "" {
		var b [8]byte
		rand.Read(b[:])
		cfg.InstanceID = hex.EncodeToString(b[:])
	}
	r := &Reconciler{
		st:          st,
		clock:       local.NewClock(),
		cfg:         cfg,
		lc:          cfg.LocalCapacity * local.Micro,
		gap:         cfg.SyncInterval / 4,
		early:       make(chan struct{}, 1),
		counted:     make(chan struct{}),
		orphans:     make(map[string]orphan),
		log:         cfg.Logger,
		inDoubt:     make(map[string]bool),
		fetchDoubts: make(map[string]doubt),
	}
	applied := make(chan struct{})
	r.applied.Store(&applied)
	r.flights.seed = maphash.MakeSeed()
	r.inline.empty = make(chan struct{})
	var id [8]byte
	rand.Read(id[:])
	r.dedup = hex.EncodeToString(id[:])
	r.fetchID = r.dedup + ".f"
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	keys, err := local.New(local.Config[State]{Capacity: cfg.MaxKeys, OnEvict: r.handOff, TrackTouched: true, Ledger: cfg.Ledger})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	r.keys = keys
	if rt, ok := st.(Router); ok && rt.Spread() {
		r.router = rt
	}
	r.callTimeout = cmp.Or(cfg.Breaker.CallTimeout, breaker.DefaultCallTimeout)
	r.nodes.Store(&map[string]*node{})
	if r.def, err = r.newNode("", "", false); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	r.live.Store(int64(max(cfg.Instances, 1)))
	ctx, stop := context.WithCancel(context.Background())
	r.stop, r.done = stop, ctx.Done()
	r.wg.Go(func() { r.loop(ctx) })
	return r, nil
}

// Keys returns the shadow buckets.
func (r *Reconciler) Keys() *local.Store[State] { return r.keys }

// Clock returns the clock the shadow buckets' times are read from.
func (r *Reconciler) Clock() local.Clock { return r.clock }

// Instances returns the fleet size used to share limits in fallback mode:
// Config.Instances if set, else the live count from the last heartbeat, at
// least 1.
func (r *Reconciler) Instances() int64 { return r.live.Load() }

// SyncInterval returns the time between two rounds.
func (r *Reconciler) SyncInterval() time.Duration { return r.cfg.SyncInterval }

// HeartbeatInterval returns Config.HeartbeatInterval, its default filled in.
func (r *Reconciler) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }

// LocalCapacity returns the most allowance one key holds, in micro-tokens.
func (r *Reconciler) LocalCapacity() int64 { return r.lc }

// Starved records that e's allowance could not pay for a request, or ran
// low: its lease grows at the next round. With early, and if the global
// bucket held enough at the last view for every instance that takes the
// key to top its lease up (see plenty), the key is also topped up in an
// early round (the first time since the last round). It never blocks.
func (r *Reconciler) Starved(e *Entry, early bool) {
	if e.X.starve() && early && r.plenty(e) {
		r.mu.Lock()
		r.low = append(r.low, e)
		r.mu.Unlock()
		select {
		case r.early <- struct{}{}:
		default:
		}
	}
}

// LowWater returns the allowance, in micro-tokens, under which a lease
// should be topped up before the next round: a quarter of its size.
// Leases under four tokens have no low-water mark: they are fetched when
// they run dry.
func (r *Reconciler) LowWater(e *Entry) int64 {
	t := int64(e.X.target.Load())
	if t < 4 {
		return 0
	}
	return t * (local.Micro / 4)
}

// Fetching reports whether a fetch of e's key is on its way: a request for
// a key whose view is fresh may rather be denied, told to retry when the
// fetch is back, than wait for it.
func (r *Reconciler) Fetching(e *Entry) bool { return e.X.flags.Load()&flagFetching != 0 }

// AwaitRound waits while a settlement round (or an early top-up) has a
// settlement of e in flight, until its reply has been applied, as long as
// the round makes progress (see awaitRound), Config.ColdWait at most and no
// longer than ctx, and reports whether there was one. A request about to be denied for want of
// allowance waits so for the allowance that round may bring: its fetch,
// sent while the round was under way, can find the bucket emptied by the
// round itself.
func (r *Reconciler) AwaitRound(ctx context.Context, e *Entry) bool {
	return r.AwaitRoundBy(ctx, e, 0)
}

// AwaitRoundBy is AwaitRound for a request that must be answered by the
// clock reading by (see ColdBy; 0: ColdWait from now, read only if a round
// holds the key): it stops waiting then, whatever the round does.
func (r *Reconciler) AwaitRoundBy(ctx context.Context, e *Entry, by time.Duration) bool {
	if !e.X.settling() {
		return false
	}
	if by == 0 {
		by = r.ColdBy()
	}
	r.awaitRound(ctx, e, func() bool { return !e.X.settling() }, by)
	return true
}

// ColdBy returns the clock reading by which a request that needs Redis now
// must be answered: Config.ColdWait from now. Every wait of the request (a
// round that holds its key, a fetch, a take, an exact decision) draws on
// it, so that no decision waits for Redis longer than ColdWait in all.
func (r *Reconciler) ColdBy() time.Duration { return r.clock.Now() + r.cfg.ColdWait }

// ColdWait returns Config.ColdWait, its default filled in.
func (r *Reconciler) ColdWait() time.Duration { return r.cfg.ColdWait }

// left returns how long until the clock reading by, 0 if it has passed.
func (r *Reconciler) left(by time.Duration) time.Duration { return max(by-r.clock.Now(), 0) }

// awaitRound waits until cond holds, for a round that holds e's key: while
// the round makes progress, a call of it answered at least every
// roundWait, until the clock reads by (a request's ColdBy; noDeadline for
// none), and no longer than ctx. It reports whether cond held. A round
// of many keys goes to Redis in calls of maxBatch keys, one after another,
// and a key of its last call waits for all of them: on a busy Redis that
// takes longer than any one call's deadline, while a Redis that stopped
// answering leaves the round without progress for a call's deadline.
func (r *Reconciler) awaitRound(ctx context.Context, e *Entry, cond func() bool, by time.Duration) bool {
	if cond() {
		return true
	}
	if r.stats.inFlight.Load() > maxBatch {
		r.hurry.add(e) // a round of several calls: it sends the key in its next one
	}
	wait := r.roundWait(e)
	t := r.timer(wait)
	defer r.putTimer(t)
	var end <-chan time.Time
	if by != noDeadline {
		bt := r.timer(r.left(by))
		defer r.putTimer(bt)
		end = bt.C
	}
	for {
		ch := *r.applied.Load() // before cond: a reply applied after this closes ch
		if cond() {
			return true
		}
		select {
		case <-ch:
			t.Reset(wait) // a call of a round answered
		case <-t.C:
			return false
		case <-end:
			return cond()
		case <-ctx.Done():
			return false
		}
	}
}

// noDeadline is the by of a wait that no request's ColdBy bounds.
const noDeadline = time.Duration(math.MaxInt64)

// roundWait is how long a round holding e's key may go without a call
// answered before awaitRound gives up on it: a call may wait in the node's
// queue behind another and then take its own deadline, each at most the
// breaker's deadline for a full call (which adapts to the latency Redis
// shows).
func (r *Reconciler) roundWait(e *Entry) time.Duration {
	return 2 * r.nodeOf(done, e.Key()).br.Timeout(maxBatch)
}

// goOwned runs f on a goroutine that Close waits for. It reports false,
// running nothing, once the Reconciler is closed. Such goroutines only make
// calls bounded by the breaker's call timeout.
func (r *Reconciler) goOwned(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Go(f)
	return true
}

// Closed reports whether Close was called. It takes no lock.
func (r *Reconciler) Closed() bool { return r.closing.Load() }

// Trust decides the first request of e, an Optimistic entry with no view of
// its bucket yet: whether it may admit cost micro-tokens at once, before
// Redis tells what the bucket holds. Only the entry's first request may (the
// first caller of Trust; it returns false to every other), within one
// instance's budget cap (Cap), only while the key's node answers (its
// breaker saw a call succeed, and the last call that counted did: a Redis
// that fails may never take the charge, and the fallback's share, which
// cannot see the charge while a round holds it, would admit the request
// again), and only if this instance does not remember evicting the key
// lately: a key made again after an eviction learns its
// bucket first, since a first request admitted on trust at each of its
// comings back would add up without bound under key churn. A caller told
// true records the request's consumption (charged at the next round, which
// also sets the key's budget) and then calls Trusted; the requests that
// fetch meanwhile wait for that (AwaitTrusted), so that the budget they
// are given counts it.
func (r *Reconciler) Trust(e *Entry, sp *Spec, cost int64) bool {
	if !e.X.claimFirst() {
		return false
	}
	if cost <= r.Cap(sp) && !r.evicted.has(e.Key()) && r.nodeOf(done, e.Key()).br.Answering() {
		return true
	}
	e.X.firstDone()
	return false
}

// Trusted records that the consumption of the request Trust admitted is in
// the entry.
func (r *Reconciler) Trusted(e *Entry) { e.X.firstDone() }

// AwaitTrusted waits while the first request of e is being admitted on
// trust (between Trust and Trusted: a few instructions), yielding.
func (r *Reconciler) AwaitTrusted(e *Entry) {
	for e.X.firstPending() {
		runtime.Gosched()
	}
}

// Orphan records consumption of cost micro-tokens for a key whose entry
// could not take it (it left the store): it is charged at the next round.
func (r *Reconciler) Orphan(key string, sp *Spec, cost int64) { r.addOrphan(key, sp, cost, 0) }

// Return gives n micro-tokens back to the global bucket of key at the next
// round: a lease let go, or a charge refunded.
func (r *Reconciler) Return(key string, sp *Spec, n int64) { r.addOrphan(key, sp, 0, n) }

// ReturnNow gives n micro-tokens back to the global bucket of key now, in
// one call through the breaker (bounded by its call timeout), rather than at
// the next round: a refund that the key's next decision must see, such as
// the Cancel of an Exact reservation. A give-back that surely was not
// applied (the breaker refused it, the connection could not be made, Redis
// answered with an error) is left for the next round, as Return does; one
// whose reply was lost may have been applied, and is dropped: applied twice,
// it would let the fleet admit more than the bucket. It is numbered, as
// fetches are, so that a client that sends it again itself (go-redis's own
// retries, after a connection reset) does not give it back twice.
func (r *Reconciler) ReturnNow(key string, sp *Spec, n int64) {
	if r.Closed() {
		r.Return(key, sp, n)
		return
	}
	s := global.Settlement{Key: key, Limit: sp.Limit, Debt: r.debt(sp), Returned: n, Instance: r.fetchID, Seq: r.fetchSeq.Add(1)}
	if _, err := r.settleOne(sp, s); err != nil && !mayBeApplied(err) {
		r.Return(key, sp, n)
	}
}

// timer returns a timer that fires after d, from r's own pool: a request
// that waits for Redis waits with one, and allocates none. Give it back with
// putTimer.
func (r *Reconciler) timer(d time.Duration) *time.Timer {
	if t, ok := r.timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// putTimer stops t and keeps it for the next timer: since Go 1.23 a timer
// reset after Stop never delivers a value from before.
func (r *Reconciler) putTimer(t *time.Timer) {
	t.Stop()
	r.timers.Put(t)
}

// deadline is how long a caller waits for a settlement's reply, with a
// timer made only once it must wait: most replies come back with the call
// the caller makes itself (see settleWait), and a timer set and stopped
// for each would cost a cold decision more than its map lookups.
type deadline struct {
	r    *Reconciler
	wait time.Duration
	t    *time.Timer
}

// c returns the channel that fires wait after its first call, nil for no
// deadline.
func (d *deadline) c() <-chan time.Time {
	if d == nil {
		return nil
	}
	if d.t == nil {
		d.t = d.r.timer(d.wait)
	}
	return d.t.C
}

// stop gives d's timer back, if it made one.
func (d *deadline) stop() {
	if d != nil && d.t != nil {
		d.r.putTimer(d.t)
		d.t = nil
	}
}
