package hybrid

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// Reset makes key's bucket full again across the fleet, whatever it held
// (a debt, a drained burst): an operator unblocking a user, as
// go-redis/redis_rate's Reset. It needs Redis: while the key's Redis is
// down it returns an error wrapping ErrUnavailable, and a failed call to
// Redis its error; it never does nothing silently. It errs for an invalid
// key and a closed Limiter as AllowN does, and takes no limit: the bucket is
// full under any.
//
// What the fleet spent or leased before the reset counts at most once
// more, and never sinks the new bucket:
//   - the consumption instances had not charged yet (a round's, a
//     settlement sent again, an optimistic budget's) takes from the new
//     bucket down to 0 at most, never into debt, for a grace of
//     resetGrace(SyncInterval, HeartbeatInterval) (2 s with the defaults)
//     after the reset; so do the late charges of an outage that began
//     before it, for resetKeep (10 minutes);
//   - tokens an instance holds in its lease were taken out of the old
//     bucket and stay spendable there: at most LocalCapacity an instance,
//     and the burst.
//
// This instance lets go of the key at once (what it held goes back, capped
// at the burst; what it spent is charged within the grace). The fleet is
// told beside its count of instances: at their next heartbeat (within
// HeartbeatInterval, a second by default) the other instances stop
// trusting their views of buckets from before the reset, so that none
// denies locally what the new bucket holds; until then one may. A reset
// whose announcement failed returns an error too (the bucket is full, and
// a Reset again is harmless).
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := limit.CheckKey(key); err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	if l.r.Closed() {
		return ErrClosed
	}
	if l.r.DegradedKey(key) {
		return fmt.Errorf("hybrid: reset %q: %w", key, ErrUnavailable)
	}
	grace := resetGrace(l.r.SyncInterval(), l.r.HeartbeatInterval())
	var at time.Time
	err := l.r.Do(ctx, key, func(ctx context.Context) (err error) {
		at, err = l.g.Reset(ctx, key, grace, max(grace, resetKeep))
		return err
	})
	if err != nil {
		return fmt.Errorf("hybrid: reset %q: %w", key, err)
	}
	l.keys.Remove(key)
	l.r.NoteReset(at)
	// The fleet learns of it at its next heartbeats.
	if err := l.r.DoFleet(ctx, func(ctx context.Context) error { return l.g.AnnounceReset(ctx, key, at) }); err != nil {
		return fmt.Errorf("hybrid: reset %q, but the fleet was not told (its instances trust their views of the bucket until they are stale; reset again): %w", key, err)
	}
	return nil
}

// resetGrace is how long after a reset the charges of the key take from the
// new bucket down to 0 at most: what was spent before it reaches Redis
// within that (the rounds, every syncInterval; a settlement sent again; an
// optimistic key settled a few rounds late), with room.
func resetGrace(syncInterval, heartbeat time.Duration) time.Duration {
	return max(20*syncInterval, 2*heartbeat)
}

// resetKeep is how long a reset's mark is kept: the late charge of an
// outage that began before the reset comes within it.
const resetKeep = 10 * time.Minute
