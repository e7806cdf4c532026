package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// fetch settles e alone for a request of cost micro-tokens.
func (r *Reconciler) fetch(e *Entry, cost int64) error {
	r.stats.fetches.Add(1)
	sp := e.X.Spec()
	if sp == nil || e.Retired() {
		return fmt.Errorf("reconcile: fetch %q: %w", e.Key(), ErrGone)
	}
	// It charges nothing: consumption is charged by the rounds alone, whose
	// settlements are sent again, not charged twice, when a reply is lost.
	s := global.Settlement{Key: e.Key(), Limit: sp.Limit, Quantum: local.Micro}
	o := owner{e: e, sp: sp}
	r.mu.Lock()
	d, resend := r.fetchDoubts[s.Key]
	delete(r.fetchDoubts, s.Key)
	r.mu.Unlock()
	if resend && r.clock.Now()-d.o.since > maxDoubt {
		r.stats.doubtsExpired.Add(1) // it charged nothing: nothing to put back
		resend = false
	}
	if resend {
		// The key's last fetch got no reply: it is sent again as it was
		// (its grant, if Redis made it, comes back as a duplicate's), and
		// no newer one goes first, which would make it read as superseded.
		s, o = d.s, d.o
		o.e, o.sp = e, sp
	} else if sp.Mode == Lease {
		if bal := e.Allowance.Load(); bal < cost {
			tgt := r.target(e, sp)
			if e.X.starved() { // it ran dry since the last round: grow now (and the round grows it again)
				tgt = r.resize(e, sp, bal, true)
			}
			s.Want = max(tgt, cost) - bal
			s.MinGrant = cost - bal
			// A grant is what a lost reply would lose: the fetch is
			// numbered, under a name of the fetches' own (one key's fetches
			// never overlap, but they may overtake its rounds), and sent
			// again by the next round if its reply is lost.
			s.Instance, s.Seq = r.fetchID, r.fetchSeq.Add(1)
		}
	}
	rep, err := r.settleOne(s)
	if err != nil {
		if s.Seq > 0 && (resend || mayBeApplied(err)) {
			if !resend {
				r.stats.uncertain.Add(1)
				o.since = r.clock.Now()
			}
			r.fetchDoubt(doubt{s, o})
		}
		return fmt.Errorf("reconcile: fetch %q: %w", e.Key(), err)
	}
	if rep.Duplicate {
		r.stats.duplicates.Add(1)
	}
	if sp.Mode == Optimistic { // the first budget is a share of the bucket
		if r.young() {
			r.recount()
		} else {
			r.awaitCount()
		}
	}
	r.apply(&s, o, &rep, r.clock.Now())
	return nil
}

// fetchDoubt keeps d, a fetch without a reply, for the key's next fetch or
// round to send again, unless a newer fetch of the key is in doubt already:
// that one went to Redis after d, so d would read as superseded (it is
// dropped, and the grant it may have got with it).
func (r *Reconciler) fetchDoubt(d doubt) {
	r.mu.Lock()
	if old, ok := r.fetchDoubts[d.s.Key]; !ok || old.s.Seq < d.s.Seq {
		r.fetchDoubts[d.s.Key] = d
	}
	r.mu.Unlock()
}

// settleOne settles s alone, now, through the breaker, and counts a
// failure. s takes nothing out of its entry (it charges and gives back
// nothing), so a failure has nothing to put back.
func (r *Reconciler) settleOne(s global.Settlement) (global.Reply, error) {
	sets := [1]global.Settlement{s}
	var replies [1]global.Reply
	err := r.Do(context.Background(), s.Key, func(ctx context.Context) error {
		if err := r.st.Settle(ctx, sets[:], replies[:]); err != nil {
			return err
		}
		return refusal(replies[:])
	})
	if err == nil {
		err = replies[0].Err
	}
	if err != nil {
		r.stats.fetchErrors.Add(1)
		r.stats.keyErrors.Add(1)
	}
	return replies[0], err
}

// Take asks Redis for cost micro-tokens of e's key for one request alone,
// now, and reports whether they were granted: the way a request gets its
// tokens when concurrent requests spent every lease a fetch brought. It waits
// at most Config.ColdWait and no longer than ctx; a grant that arrives after
// the caller gave up joins e's allowance.
func (r *Reconciler) Take(ctx context.Context, e *Entry, cost int64) (bool, error) {
	sp := e.X.Spec()
	if sp == nil || e.Retired() {
		return false, fmt.Errorf("reconcile: take %q: %w", e.Key(), ErrGone)
	}
	type result struct {
		granted bool
		err     error
	}
	ch := make(chan result, 1)
	var decided atomic.Bool // set by whichever side decides first: the answer, or the caller giving up
	if !r.goOwned(func() {
		granted, err := r.take(e, sp, cost, &decided)
		ch <- result{granted, err}
	}) {
		return false, ErrClosed
	}
	t := time.NewTimer(r.cfg.ColdWait)
	defer t.Stop()
	select {
	case res := <-ch:
		return res.granted, res.err
	case <-t.C:
		r.stats.fetchTimeouts.Add(1)
	case <-ctx.Done():
	}
	if !decided.CompareAndSwap(false, true) { // the answer came first: it is on its way
		res := <-ch
		return res.granted, res.err
	}
	return false, fmt.Errorf("reconcile: take %q: %w within %v", e.Key(), ErrNoAnswer, r.cfg.ColdWait)
}

// take settles cost micro-tokens, all or nothing, for one request.
func (r *Reconciler) take(e *Entry, sp *Spec, cost int64, decided *atomic.Bool) (bool, error) {
	r.stats.fetches.Add(1)
	s := global.Settlement{Key: e.Key(), Limit: sp.Limit, Want: cost, MinGrant: cost, Quantum: local.Micro}
	rep, err := r.settleOne(s)
	if err != nil {
		decided.Store(true)
		return false, fmt.Errorf("reconcile: take %q: %w", e.Key(), err)
	}
	r.stats.keysSettled.Add(1)
	if rep.Reset {
		r.stats.resets.Add(1)
	}
	e.SetView(local.View{Tokens: rep.Tokens, Seen: r.clock.Now()})
	granted := rep.Granted
	if !decided.CompareAndSwap(false, true) && granted > 0 { // the caller gave up
		if !e.Allowance.Add(granted) { // nobody will spend it: give it back
			r.addOrphan(e.Key(), sp, 0, granted)
		}
		return false, nil
	}
	return granted > 0, nil
}

// mayBeApplied reports whether a settlement that failed with err may have
// been applied by Redis all the same: unless it was never sent (the breaker
// refused it, the connection could not be made) or Redis answered with an
// error (the script stops before it writes), it may have been.
func mayBeApplied(err error) bool {
	var op *net.OpError
	var re redis.Error
	switch {
	case errors.Is(err, breaker.ErrOpen), errors.As(err, &op) && op.Op == "dial", errors.As(err, &re):
		return false
	}
	return true
}
