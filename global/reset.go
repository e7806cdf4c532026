package global

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// maxResetMS bounds Reset's durations: 2^40 ms, the script's bound.
const maxResetMS = 1 << 40

// Reset makes the bucket of key full again, whatever it held and under
// whatever limit, with one script call (lua.Reset), and marks it: for
// grace, the charges that Settle makes take from the new bucket down to 0
// at most, never into debt (what was spent before the reset counts at most
// once more, within the burst), and until keep, so do the charges of an
// outage that began before the reset (Settlement.Since). It drops the
// bucket's records of numbered settlements: one sent again is applied as
// new. It returns the Redis time of the reset. grace and keep are at least
// a millisecond and at most 2^40, grace at most keep.
func (l *Limiter) Reset(ctx context.Context, key string, grace, keep time.Duration) (time.Time, error) {
	if err := limit.CheckKey(key); err != nil {
		return time.Time{}, fmt.Errorf("global: reset %q: %w", key, err)
	}
	g, k := grace.Milliseconds(), keep.Milliseconds()
	if g < 1 || k > maxResetMS || g > k {
		return time.Time{}, fmt.Errorf("global: reset %q: grace %v and keep %v: want 1ms <= grace <= keep <= 2^40 ms", key, grace, keep)
	}
	x, err := l.runInts(ctx, l.reset, []string{l.Key(key)}, 1, g, k)
	if err == nil && (x[0] < 0 || x[0] > maxAmount) {
		err = fmt.Errorf("%w: time %d µs is outside [0, 2^53)", ErrReply, x[0])
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("global: reset %q: %w", key, err)
	}
	return time.UnixMicro(x[0]), nil
}
