package hybrid

import (
	"fmt"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/reconcile"
)

// specFor validates key and lim for a request on key, whose entry e is as
// looked up already (nil if none), and returns lim's spec: e's own when it
// is kept under lim (a valid key then, whose checks are skipped), else the
// interned one.
func (l *Limiter) specFor(key string, lim Limit, e *reconcile.Entry) (*reconcile.Spec, error) {
	if e != nil {
		if sp := e.X.Spec(); sp != nil && sp.Is(lim.Rate, lim.Burst, lim.Mode) {
			return sp, nil
		}
	} else if err := limit.CheckKey(key); err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	sp, err := l.spec(lim)
	if err != nil {
		return nil, fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	return sp, nil
}

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
