package bench

import (
	"context"
	"errors"
	"time"
)

// outage takes the Target's Redis down at sc.Outage.At after start and
// brings it back, empty, sc.Outage.For later, recording both moments. If
// ctx ends first, it does not take Redis down, or brings it back at once.
func (r *run) outage(ctx context.Context, start time.Time) error {
	o := r.sc.Outage
	timer := time.NewTimer(time.Until(start.Add(o.At)))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-timer.C:
	}
	down := int64(time.Since(start))
	r.downAt.Store(down)
	if r.onOutage != nil {
		r.onOutage("down", down)
	}
	err := r.t.down()
	timer.Reset(time.Until(start.Add(o.At + o.For)))
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	if uerr := r.t.up(context.WithoutCancel(ctx)); uerr != nil {
		return errors.Join(err, uerr)
	}
	back := int64(time.Since(start))
	r.backAt.Store(back)
	if r.onOutage != nil {
		r.onOutage("up", back)
	}
	return err
}

// inOutage reports whether a decision issued at since (from the first
// arrival) was issued while Redis was down.
func (r *run) inOutage(since time.Duration) bool {
	down := r.downAt.Load()
	if down < 0 || int64(since) < down {
		return false
	}
	back := r.backAt.Load()
	return back < 0 || int64(since) < back
}

// degraded reports whether any hybrid instance's fallback policy is
// deciding now.
func (r *run) degraded() bool {
	for _, in := range r.insts {
		if d, ok := in.dec.(*hybridDecider); ok && d.l.Stats().Degraded {
			return true
		}
	}
	return false
}
