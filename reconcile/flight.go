package reconcile

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// A key's fetches go one at a time, and the requests that come while one is
// on its way share it: the first request leads a flight of the key, and the
// others join it and wait for its end. A lease key's leader makes the fetch
// itself, on its own goroutine, as an exact decision makes its call: no
// goroutine or channel of the fetch's own when nobody else waits for the
// key, which is the long tail's every request.
//
// The leader waits for the reply at most Config.ColdWait and no longer than
// its ctx; a reply that comes after it gave up is applied all the same, by
// a goroutine made then, so that a grant is spent or given back, never
// lost. It may send its batch itself (see SettleNow), as any request does,
// and then waits for the call, whose deadline is the breaker's call timeout
// at least (ColdWait's default), as an exact decision does; with ColdWait
// below that timeout it leaves the batch to the node's flushers.
//
// An optimistic key's leader hands the fetch to a goroutine and waits for
// it as the others do: its fetch may first wait for a round charging the
// key (see awaitCharge), and ColdWait counts from when its own round trip
// begins.

// flight is a fetch of a key on its way. done is made when the first
// request joins it, and closed with err set when the fetch ends.
type flight struct {
	done chan struct{}
	err  error
}

// flights are the keys' flights, by key (an entry made again after an
// eviction shares its key's flight with the entry before it).
type flights struct {
	seed   maphash.Seed
	shards [flightShards]flightShard
}

// flightShards spreads the flights over locks by key.
const flightShards = 16

type flightShard struct {
	mu sync.Mutex
	m  map[string]*flight
	_  [48]byte // keep shards on separate cache lines
}

// shard returns the shard of key's flight.
func (fs *flights) shard(key string) *flightShard {
	return &fs.shards[maphash.String(fs.seed, key)%flightShards]
}

// join returns key's flight and whether the caller leads it: a new one if
// there is none (the caller fetches), else the one on its way, with a
// channel for the end the caller waits for.
func (fs *flights) join(key string) (*flight, bool) {
	sh := fs.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if fl := sh.m[key]; fl != nil {
		if fl.done == nil {
			fl.done = make(chan struct{})
		}
		return fl, false
	}
	if sh.m == nil {
		sh.m = map[string]*flight{}
	}
	fl := &flight{}
	sh.m[key] = fl
	return fl, true
}

// joinOnly returns key's flight on its way, with a channel for its end, or
// nil if there is none.
func (fs *flights) joinOnly(key string) *flight {
	sh := fs.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	fl := sh.m[key]
	if fl != nil && fl.done == nil {
		fl.done = make(chan struct{})
	}
	return fl
}

// await gives fl, key's flight, the channel its end closes, if it has none.
func (fs *flights) await(key string, fl *flight) {
	sh := fs.shard(key)
	sh.mu.Lock()
	if fl.done == nil {
		fl.done = make(chan struct{})
	}
	sh.mu.Unlock()
}

// land ends key's flight fl with err, and wakes those who joined it.
func (fs *flights) land(key string, fl *flight, err error) {
	sh := fs.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	fl.err = err
	done := fl.done
	sh.mu.Unlock()
	if done != nil {
		close(done)
	}
}

// Fetch settles e's key alone, now, for a request of cost micro-tokens:
// it charges what e consumed unsettled, and in lease mode asks for allowance
// (at least cost, or nothing). Concurrent fetches of one key share one round
// trip. It waits at most Config.ColdWait in all (and no longer than ctx):
// for the round charging an optimistic key, if one is, and then for its
// own round trip; an error means the caller should decide by the fallback
// policy.
func (r *Reconciler) Fetch(ctx context.Context, e *Entry, cost int64) error {
	return r.FetchBy(ctx, e, cost, r.ColdBy())
}

// FetchBy is Fetch for a request that must be answered by the clock
// reading by (see ColdBy): a request that fetches more than once, or takes
// after it, waits no longer in all.
func (r *Reconciler) FetchBy(ctx context.Context, e *Entry, cost int64, by time.Duration) error {
	if e.X.roundCharging() {
		// The fetch would wait for the round charging the key (an
		// optimistic key's charges go one at a time: see fetch). The
		// request waits for it here, while it makes progress, and then
		// for its own round trip, until by in all.
		r.awaitRound(ctx, e, func() bool { return !e.X.roundCharging() }, by)
	}
	fl, lead := r.flights.join(e.Key())
	if lead {
		if sp := e.X.Spec(); sp != nil && sp.Mode == Lease {
			return r.leadFetch(ctx, e, cost, fl, by)
		}
		r.flights.await(e.Key(), fl) // a channel to wait on, as those who join have
		e.X.flags.Or(flagFetching)
		if !r.goOwned(func() { r.fly(e, fl, r.fetch(e, cost, nil)) }) {
			r.fly(e, fl, ErrClosed)
			return ErrClosed
		}
	}
	return r.awaitFlight(ctx, e, fl, by)
}

// AwaitFetchBy waits for the fetch of e's key on its way, if one is, until
// the clock reads by (see ColdBy) and no longer than ctx, and reports
// whether one was: a request that fetched as often as it may waits so for
// a fetch that counted its need (see AddDemand), rather than take its cost
// alone beside it.
func (r *Reconciler) AwaitFetchBy(ctx context.Context, e *Entry, by time.Duration) bool {
	if !r.Fetching(e) {
		return false
	}
	fl := r.flights.joinOnly(e.Key())
	if fl == nil {
		return false
	}
	_ = r.awaitFlight(ctx, e, fl, by) // the caller reads what it brought, if anything
	return true
}

// fly lands fl, the flight of e's key, with err: the key is no longer
// being fetched (see Fetching).
func (r *Reconciler) fly(e *Entry, fl *flight, err error) {
	e.X.flags.And(^flagFetching)
	r.flights.land(e.Key(), fl, err)
}

// awaitFlight waits for fl, a flight of e's key that another request or a
// goroutine of its own makes, to end: until the clock reads by (the
// request's ColdBy), however long the fetch waits for a round charging the
// key before its own round trip (see awaitCharge), and no longer than ctx.
// A fetch it stops waiting for goes on: what it brings reaches the entry.
func (r *Reconciler) awaitFlight(ctx context.Context, e *Entry, fl *flight, by time.Duration) error {
	t := r.timer(r.left(by))
	defer r.putTimer(t)
	select {
	case <-fl.done:
		return fl.err
	case <-t.C:
		r.stats.fetchTimeouts.Add(1)
		return fmt.Errorf("reconcile: fetch %q: %w within %v", e.Key(), ErrNoAnswer, r.cfg.ColdWait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leadFetch makes the fetch of fl, a flight of e's lease key, on the
// caller's goroutine (see Fetch).
func (r *Reconciler) leadFetch(ctx context.Context, e *Entry, cost int64, fl *flight, by time.Duration) error {
	if !r.inline.enter() {
		r.flights.land(e.Key(), fl, ErrClosed)
		return ErrClosed
	}
	e.X.flags.Or(flagFetching)
	lw := &leadWait{ctx: ctx, timeout: deadline{r: r, wait: r.left(by)}, fl: fl}
	err := r.fetch(e, cost, lw)
	lw.timeout.stop()
	if !lw.late {
		r.fly(e, fl, err)
	}
	r.inline.leave()
	return err
}

// leadWait is how long a fetch's leader waits for its reply: until timeout
// or until ctx is done. late is set if it gave up: the flight lands once the
// reply has been applied.
type leadWait struct {
	ctx     context.Context
	timeout deadline
	fl      *flight
	late    bool
}

// gate lets Close wait for the fetches that requests make on their own
// goroutines (see leadFetch): a count of them, and a channel Close waits on
// once closing, closed when the last leaves.
type gate struct {
	n       atomic.Int64
	closing atomic.Bool
	once    sync.Once
	empty   chan struct{}
}

// enter counts a fetch in, and reports false, counting nothing, once Close
// began.
func (g *gate) enter() bool {
	g.n.Add(1)
	if g.closing.Load() {
		g.leave()
		return false
	}
	return true
}

// leave counts a fetch out.
func (g *gate) leave() {
	if g.n.Add(-1) == 0 && g.closing.Load() {
		g.once.Do(func() { close(g.empty) })
	}
}

// close makes enter refuse, and waits for the fetches counted in to leave.
func (g *gate) close() {
	g.closing.Store(true)
	if g.n.Load() > 0 {
		<-g.empty
	}
}
