package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/plural"
)

// Close stops the goroutine, waits for it and for every fetch under way,
// then settles every key for the last time: unspent leases go back and
// unsettled consumption is charged, within ctx. It removes this instance
// from the fleet count. It returns an error if something could not be
// settled. Close is idempotent: later calls return nil.
func (r *Reconciler) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.closing.Store(true)
	r.mu.Unlock()
	r.stop()
	r.wg.Wait()
	r.inline.close() // and the fetches its requests make themselves

	r.keys.Drain() // every entry's dues become an orphan
	r.sets, r.owners = r.sets[:0], r.owners[:0]
	r.takeDoubts() // first: a key's settlement in doubt goes before its dues
	clear(r.inDoubt)
	r.takeOrphans(true)
	var errs []error
	var lost int64 // consumption not charged
	if len(r.sets) > 0 {
		replies := make([]global.Reply, len(r.sets))
		var err error
		// In calls of at most maxBatch keys, as rounds are: one call for
		// every key left could outlast any timeout.
		for lo := 0; lo < len(r.sets); lo += maxBatch {
			hi := min(lo+maxBatch, len(r.sets))
			if cerr := r.st.Settle(ctx, r.sets[lo:hi], replies[lo:hi]); err == nil {
				err = cerr
			}
		}
		failed := 0
		for i := range replies {
			if replies[i].Err != nil {
				failed++
				lost += r.sets[i].Consumed
				if err == nil {
					err = replies[i].Err
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile: close: %d of %s not settled: %w", failed, plural.Count(len(r.sets), "key"), err))
		}
	}
	r.stats.unsettled.Store(lost)
	r.stats.inFlight.Store(0)
	if _, err := r.st.Leave(ctx, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: close: leave the fleet: %w", err))
	}
	r.unwitness(ctx)
	err := errors.Join(errs...)
	r.logClose(len(r.sets), lost, err)
	return err
}
