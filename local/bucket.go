// Package local keeps the in-process side of the limiter: token-bucket
// arithmetic in integer micro-tokens, an allowance that can be spent without
// reading a clock, and a bounded, sharded store of shadow buckets, one entry
// per key this instance has seen recently.
//
// Time here is monotonic and passed in: a time.Duration elapsed since an
// epoch the caller fixes (see Clock). Nothing in this package reads a clock
// on its own, starts a goroutine or does I/O.
package local

import (
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// Micro is the number of micro-tokens in one token.
const Micro = limit.Micro

// Limit is a validated token-bucket limit in micro-tokens: Rate micro-tokens
// per second refill a bucket of at most Burst micro-tokens. Build one with
// NewLimit.
type Limit = limit.MicroLimit

// NewLimit validates a limit of rate tokens per second and a burst of burst
// tokens and returns it in micro-tokens. The error wraps ErrInvalidLimit.
func NewLimit(rate float64, burst int64) (Limit, error) {
	return limit.Limit{Rate: rate, Burst: burst}.Micro()
}

// Errors for misuse, shared with the other tiers.
var (
	ErrInvalidLimit = limit.ErrInvalidLimit
	ErrInvalidCost  = limit.ErrInvalidCost
	ErrInvalidKey   = limit.ErrInvalidKey
)

// Clock reads monotonic time as the Duration since the Clock was made, the
// form every function in this package takes. The zero Clock is not usable;
// make one with NewClock. Reading it costs a monotonic clock read.
type Clock struct {
	epoch time.Time
}

// NewClock returns a Clock whose epoch is now.
func NewClock() Clock { return Clock{epoch: time.Now()} }

// Now returns the monotonic time elapsed since c was made.
func (c Clock) Now() time.Duration { return time.Since(c.epoch) }

// Time returns the time.Time of the monotonic reading d, with its monotonic
// part, so that time.Since(c.Time(d)) is exact. It reads no clock.
func (c Clock) Time(d time.Duration) time.Time { return c.epoch.Add(d) }

// Bucket is the state of one token bucket. Its methods are pure: they
// compute from the limit and the time they are given and read no clock, so
// the same calls give the same answers. The time of a Bucket never moves
// backwards: a now earlier than the last one seen counts as that last one.
//
// Tokens are micro-tokens. A bucket may hold fewer than zero (a debt charged
// while the limit could not be checked); it refills at the limit's rate up to
// its burst. The refill carries its sub-micro-token remainder, so refilling in
// many small steps gives exactly what one step gives.
//
// The zero Bucket is empty at time 0; Full returns a full one. A Bucket is not
// safe for concurrent use: Entry guards its own.
type Bucket struct {
	tokens int64         // micro-tokens at last
	last   time.Duration // monotonic time of tokens
	frac   int64         // refill remainder, micro-token-nanoseconds, < 1e9
}

// Full returns a bucket holding lim.Burst micro-tokens at now.
func Full(lim Limit, now time.Duration) Bucket {
	return Bucket{tokens: lim.Burst, last: now}
}

// Advance refills b to now. A now before b's last time changes nothing but a
// burst that shrank: the tokens are capped at lim.Burst.
func (b *Bucket) Advance(now time.Duration, lim Limit) {
	if now > b.last {
		elapsed := now - b.last
		b.last = now
		if b.tokens < lim.Burst {
			add, rem := limit.Refill(elapsed, lim.Rate, b.frac)
			if add < lim.Burst-b.tokens {
				b.tokens += add
				b.frac = rem
				return
			}
			b.tokens = lim.Burst // full: the remainder goes with the overflow
		}
	}
	if b.tokens >= lim.Burst {
		b.tokens = lim.Burst
		b.frac = 0
	}
}

// TakeAt refills b to now and takes n micro-tokens if it holds at least n. It
// reports whether it took them; a bucket that cannot pay is left as it is.
func (b *Bucket) TakeAt(now time.Duration, lim Limit, n int64) bool {
	b.Advance(now, lim)
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// Charge refills b to now and takes n micro-tokens whether or not it holds
// them, sinking at most to -lim.Burst: the way consumption that was admitted
// elsewhere (or during an outage) is settled without a long false-deny period.
func (b *Bucket) Charge(now time.Duration, lim Limit, n int64) {
	b.Advance(now, lim)
	b.tokens = max(b.tokens-n, -lim.Burst)
}

// Put refills b to now and gives back n micro-tokens, up to lim.Burst.
func (b *Bucket) Put(now time.Duration, lim Limit, n int64) {
	b.Advance(now, lim)
	b.tokens = min(b.tokens+n, lim.Burst)
	if b.tokens == lim.Burst {
		b.frac = 0
	}
}

// Tokens returns the micro-tokens b holds at now, without changing b.
func (b Bucket) Tokens(now time.Duration, lim Limit) int64 {
	b.Advance(now, lim)
	return b.tokens
}

// Remaining returns the whole tokens b holds at now, never below zero.
func (b Bucket) Remaining(now time.Duration, lim Limit) int64 {
	return max(b.Tokens(now, lim), 0) / Micro
}

// RetryAfter returns how long after now b will hold n micro-tokens: zero if it
// holds them already. It is exact to the nanosecond: TakeAt(now+RetryAfter)
// succeeds and TakeAt one nanosecond earlier does not (for n <= lim.Burst).
func (b Bucket) RetryAfter(now time.Duration, lim Limit, n int64) time.Duration {
	b.Advance(now, lim)
	return limit.Wait(n-b.tokens, b.frac, lim.Rate)
}

// ResetAfter returns how long after now b will be full.
func (b Bucket) ResetAfter(now time.Duration, lim Limit) time.Duration {
	return b.RetryAfter(now, lim, lim.Burst)
}
