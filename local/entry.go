package local

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Entry is the shadow bucket of one key: what this instance may spend without
// asking Redis, what it spent and has not settled, a local token bucket, and
// the last view of the global bucket, so that denials are answered locally too.
//
// Entries are made by a Store and live until they leave it (evicted,
// removed or drained); then they are retired: their counts hand their
// contents to the store's owner and accept nothing more. The owner keeps its
// own per-key state in X. Entry is safe for concurrent use.
type Entry[X any] struct {
	// X is the owner's own state for the key, which the owner guards. (It
	// comes first: a zero-size X at the end would be padded.)
	X X

	key     string
	hash    uint32        // the high half of the key's hash: its slot in the table
	touched atomic.Uint32 // the store epoch of the last recency update

	// Allowance holds the micro-tokens this instance may spend with no clock
	// read and no lock, and counts the decisions that spent them.
	Allowance Allowance
	// Pending holds the micro-tokens consumed here and not yet settled.
	Pending Tokens

	// own is the local token bucket, made the first time it is used (an
	// outage's fallback): a key that never needs one keeps 24 bytes less.
	own atomic.Pointer[ownBucket]

	view viewCell // the last view of the global bucket
}

// Key returns the key e is the shadow of.
func (e *Entry[X]) Key() string { return e.key }

// Retired reports whether e has left its store. A retired entry spends and
// accepts nothing; look the key up again.
func (e *Entry[X]) Retired() bool { return e.Allowance.Retired() }

// retire retires both counts and returns what they held.
func (e *Entry[X]) retire() (unused, pending int64) {
	return e.Allowance.Retire(), e.Pending.Retire()
}

// ownBucket is an entry's local token bucket and its lock, and what its
// takes since TakeFrom seeded it kept of its refill (see TakeKept).
type ownBucket struct {
	mu     sync.Mutex
	bucket Bucket // bucket.last == unset until first used or set
	credit credit
	full   time.Duration // when bucket is full again, as of its last take or put; 0: not known
}

// credit is what an entry's local bucket gave since TakeFrom seeded it, as
// TakeKept reports it: the seed's time; the limit of the last take; the
// bucket as it would be had nobody taken from it (the seed, refilled);
// what was taken; what TakeKept reported kept, and of what was taken; and
// what a failed report gave back.
type credit struct {
	since    time.Duration // 0: not seeded since the last SetBucket or full start
	lim      Limit
	untaken  Bucket
	taken    int64
	reported int64
	seen     int64 // taken, as of the last report
	carried  int64
}

// local returns e's local bucket, making it the first time.
func (e *Entry[X]) local() *ownBucket {
	if b := e.own.Load(); b != nil {
		return b
	}
	b := &ownBucket{bucket: Bucket{last: unset}}
	if e.own.CompareAndSwap(nil, b) {
		return b
	}
	return e.own.Load()
}

// TakeAt takes n micro-tokens from e's local bucket at now, if it holds them,
// and reports whether it did. The bucket is made full the first time it is
// used (or when it was never set with SetBucket).
func (e *Entry[X]) TakeAt(now time.Duration, lim Limit, n int64) bool {
	b := e.local()
	b.mu.Lock()
	b.initLocked(now, lim)
	ok := b.bucket.TakeAt(now, lim, n)
	b.mu.Unlock()
	return ok
}

// TakeFrom is TakeAt for a bucket that, unless a TakeFrom started it at or
// after after, starts at now with seed micro-tokens (within [0,
// lim.Burst]) rather than full: the owner's share of what it last saw the
// global bucket hold. A bucket started since after goes on as it is; one
// started before (in an earlier outage, say) starts anew, however lately
// it was used: an outage's bucket used in the last moments of that outage
// would otherwise go on into the next one, with what it refilled in
// between.
func (e *Entry[X]) TakeFrom(now time.Duration, lim Limit, n int64, after time.Duration, seed int64) bool {
	b := e.local()
	b.mu.Lock()
	if b.credit.since == 0 || b.credit.since < after {
		b.bucket = Bucket{tokens: min(max(seed, 0), lim.Burst), last: now}
		b.credit = credit{since: max(now, 1), untaken: b.bucket}
	}
	ok := b.bucket.TakeAt(now, lim, n)
	if ok && b.credit.since != 0 {
		b.credit.lim, b.credit.taken = lim, b.credit.taken+n
	}
	b.noteFull(lim)
	b.mu.Unlock()
	return ok
}

// noteFull records when b's bucket, under lim, is full again. b.mu must be
// held.
func (b *ownBucket) noteFull(lim Limit) {
	b.full = b.bucket.last + b.bucket.ResetAfter(b.bucket.last, lim)
}

// Full returns when e's local bucket is full again, as of the last
// TakeFrom or PutAt under the limit they were given: ok is false if
// neither was made.
func (e *Entry[X]) Full() (full time.Duration, ok bool) {
	full, _, ok = e.fullAt()
	return full, ok
}

// fullAt is Full that also returns the time of the bucket's last take or
// put, a clock reading no later than now.
func (e *Entry[X]) fullAt() (full, last time.Duration, ok bool) {
	b := e.own.Load()
	if b == nil {
		return 0, 0, false
	}
	b.mu.Lock()
	full, last = b.full, b.bucket.last
	b.mu.Unlock()
	return full, last, full != 0
}

// Started reports whether e's local bucket was started by TakeFrom at or
// after after: a TakeFrom with that after would go on with it, not start it
// anew.
func (e *Entry[X]) Started(after time.Duration) bool {
	b := e.own.Load()
	if b == nil {
		return false
	}
	b.mu.Lock()
	since := b.credit.since
	b.mu.Unlock()
	return since != 0 && since >= after
}

// TakeKept reports what e's local bucket gave since TakeFrom seeded it, or
// since the last TakeKept, and resets the count: since is when the seed
// was made, and kept the part of what was taken that the
// bucket's refill paid for beyond what it would hold had nobody taken from
// it: the refill it kept because takes had made room below its burst,
// which a bucket nobody took from would have lost. Bucket B refilled at R
// and seeded with s holds min(B, s + R*t) untaken; taken less that, less
// what it holds after the takes, is kept (at least 0). ok is false when
// nothing was taken since the seed or the last report, or the bucket was
// not seeded by TakeFrom.
func (e *Entry[X]) TakeKept() (since time.Duration, kept int64, ok bool) {
	b := e.own.Load()
	if b == nil {
		return 0, 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c := &b.credit
	if c.since == 0 || c.taken == c.seen && c.carried == 0 {
		return 0, 0, false
	}
	// Kept so far: taken, less what the untaken bucket holds beyond this
	// one. It only grows (while the untaken bucket is full and this one is
	// not), but for a take undone.
	c.untaken.Advance(b.bucket.last, c.lim)
	total := max(c.taken-max(c.untaken.tokens-b.bucket.tokens, 0), 0)
	kept = max(total-c.reported, 0) + c.carried
	c.reported, c.seen, c.carried = max(total, c.reported), c.taken, 0
	return c.since, kept, true
}

// PutKept gives back kept micro-tokens that a TakeKept reported and that
// could not be used (its settlement failed): the next TakeKept of the same
// seed reports them again.
func (e *Entry[X]) PutKept(since time.Duration, kept int64) {
	b := e.own.Load()
	if b == nil || kept <= 0 {
		return
	}
	b.mu.Lock()
	if b.credit.since == since {
		b.credit.carried += kept
	}
	b.mu.Unlock()
}

// PutAt gives n micro-tokens back to e's local bucket at now, up to its
// burst.
func (e *Entry[X]) PutAt(now time.Duration, lim Limit, n int64) {
	b := e.local()
	b.mu.Lock()
	b.initLocked(now, lim)
	b.bucket.Put(now, lim, n)
	if b.credit.since != 0 {
		b.credit.taken = max(b.credit.taken-n, 0) // a take undone
	}
	b.noteFull(lim)
	b.mu.Unlock()
}

// Bucket returns a copy of e's local bucket, refilled to now.
func (e *Entry[X]) Bucket(now time.Duration, lim Limit) Bucket {
	b := e.local()
	b.mu.Lock()
	b.initLocked(now, lim)
	b.bucket.Advance(now, lim)
	c := b.bucket
	b.mu.Unlock()
	return c
}

// SetBucket replaces e's local bucket, and ends what TakeKept counts.
func (e *Entry[X]) SetBucket(c Bucket) {
	b := e.local()
	b.mu.Lock()
	b.bucket = c
	b.credit = credit{}
	b.full = 0
	b.mu.Unlock()
}

// unset marks a bucket that was never used nor set. No Clock reads it.
const unset = time.Duration(math.MinInt64)

// newEntry returns a live entry for key with a bucket not yet set.
func newEntry[X any](key string, hash uint32) *Entry[X] {
	return &Entry[X]{key: key, hash: hash}
}

// initLocked makes a bucket that was never set full. b.mu must be held.
func (b *ownBucket) initLocked(now time.Duration, lim Limit) {
	if b.bucket.last == unset {
		b.bucket = Full(lim, now)
	}
}

// View is the last answer the global bucket gave for a key.
type View struct {
	Tokens int64         // micro-tokens the global bucket held; may be negative
	Seen   time.Duration // local monotonic time the answer arrived; 0: never
}

// Age returns how old v is at now.
func (v View) Age(now time.Duration) time.Duration { return max(now-v.Seen, 0) }

// SetView records v as the latest view of the global bucket. Writers are
// serialised; readers never block and never see a torn view.
func (e *Entry[X]) SetView(v View) { e.view.store(v) }

// View returns the latest view of the global bucket, the zero View if none
// was set. It writes no shared memory, so denials answered from it scale
// across cores.
func (e *Entry[X]) View() View { return e.view.load() }

// TryView is View when no writer is under way, small enough to be inlined:
// ok is false while one is, and then View waits it out.
func (e *Entry[X]) TryView() (v View, ok bool) { return e.view.tryLoad() }

// viewCell is a View that readers load without a lock and never torn: a
// sequence count, odd while a writer is under way, guards its two words.
// It is not generic, so that the hot path's load is inlined.
type viewCell struct {
	seq    atomic.Uint64 // odd while a write is under way
	tokens atomic.Int64  // micro-tokens the global bucket held
	seen   atomic.Int64  // local monotonic time it was seen, ns
}

// store records v; writers are serialised.
func (c *viewCell) store(v View) {
	for { // a writer makes the sequence odd, the others wait for it
		if s := c.seq.Load(); s&1 == 0 && c.seq.CompareAndSwap(s, s+1) {
			break
		}
		runtime.Gosched()
	}
	c.tokens.Store(v.Tokens)
	c.seen.Store(int64(v.Seen))
	c.seq.Add(1)
}

// load returns the view: at once when no writer is under way, else from
// loadSlow.
func (c *viewCell) load() View {
	if v, ok := c.tryLoad(); ok {
		return v
	}
	return c.loadSlow()
}

// tryLoad is load when no writer is under way, small enough to be inlined.
func (c *viewCell) tryLoad() (View, bool) {
	s := c.seq.Load()
	v := View{Tokens: c.tokens.Load(), Seen: time.Duration(c.seen.Load())}
	return v, s&1 == 0 && c.seq.Load() == s
}

// loadSlow is load that waits out a writer.
func (c *viewCell) loadSlow() View {
	for {
		s := c.seq.Load()
		if s&1 == 0 {
			v := View{Tokens: c.tokens.Load(), Seen: time.Duration(c.seen.Load())}
			if c.seq.Load() == s {
				return v
			}
		}
		runtime.Gosched() // a writer is between its two increments
	}
}
