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

// fetch settles e alone for a request of cost micro-tokens: in lease mode
// it asks for allowance and charges nothing (consumption is charged by the
// rounds); in optimistic mode it charges the key's consumption and renews
// its budget. With lw (a lease key's fetch that its request makes, see
// leadFetch), it waits for the reply no longer than lw says: if it gives
// up, a goroutine applies the reply when it comes and lands the flight,
// and fetch returns at once.
func (r *Reconciler) fetch(e *Entry, cost int64, lw *leadWait) error {
	r.stats.fetches.Add(1)
	sp := e.X.Spec()
	if sp == nil || e.Retired() {
		return fmt.Errorf("reconcile: fetch %q: %w", e.Key(), ErrGone)
	}
	if sp.Mode == Optimistic {
		// One charge of the key at a time: a round's, sent and not
		// applied, would leave the bucket this fetch is answered from
		// fuller than it is, and its budget or grant would count the
		// tokens that charge takes.
		if wait, ok := r.awaitCharge(e); !ok {
			return fmt.Errorf("reconcile: fetch %q: a round charging the key: %w within %v", e.Key(), ErrNoAnswer, wait)
		}
		defer e.X.releaseCharge()
	}
	s := global.Settlement{Key: e.Key(), Limit: sp.Limit, Debt: r.debt(sp), Quantum: local.Micro}
	o := owner{e: e, sp: sp}
	first := e.View().Seen == 0
	ahead := false // a lease turn taken ahead (see Ahead)
	var d doubt
	resend := false
	if r.nfetchDoubts.Load() > 0 {
		r.mu.Lock()
		if d, resend = r.fetchDoubts[s.Key]; resend {
			delete(r.fetchDoubts, s.Key)
			r.nfetchDoubts.Store(int64(len(r.fetchDoubts)))
		}
		r.mu.Unlock()
	}
	if resend && r.clock.Now()-d.o.since > maxDoubt {
		// Given up: its consumption is charged anew (twice at worst,
		// which errs towards denying), its give-back dropped.
		r.stats.doubtsExpired.Add(1)
		r.restore(&d.s, d.o, false, true)
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
			// A lease that ran dry since the last round grows now (and the
			// round does not grow it again); one that the last round took
			// back because the key was idle does not: it was not too small.
			if starved, idle := e.X.clearStarved(), e.X.clearIdle(); starved && !idle {
				tgt = r.resize(e, sp, bal, 0, true)
			}
			if cost > tgt { // a lease holds a request's cost at least
				tgt = min((cost+local.Micro-1)/local.Micro*local.Micro, r.maxLease(sp)) // beyond its share, if it must
			}
			e.X.target.Store(uint32(tgt / local.Micro))
			// What the requests waiting for the key need, if more: they
			// came while the last fetch was on its way, and this one serves
			// them all (whole tokens, within the most a lease holds).
			need := r.sides.demand(e) / local.Micro * local.Micro
			if r.Ahead(e, sp) {
				// A key the fleet contends for: its turn is taken ahead
				// (see Ahead), whole tokens, the request's cost at least;
				// not what all the requests waiting need, whose turn it
				// would make longer than the others', queued as long.
				// Not numbered: a lost reply loses the turn (towards
				// denying).
				s.Consumed = (max(r.aheadTurn(sp), cost-bal) + local.Micro - 1) / local.Micro * local.Micro
				ahead = true
			} else {
				s.Want = max(min(max(tgt, need), r.LeaseCap(e, sp)), cost) - bal
				s.MinGrant = cost - bal
			}
			// A lease beyond the request is what a lost reply would lose:
			// such a fetch is numbered, under a name of the fetches' own
			// (one key's fetches never overlap, but they may overtake its
			// rounds), and sent again by the next round if its reply is
			// lost. A fetch for the requests alone is not: a lost reply
			// loses what they would have spent (towards denying), and the
			// key keeps no record of this instance in Redis: a long tail of
			// keys each asked now and then costs Redis the bucket alone.
			// What the fallback admitted for the key (a lease key's only
			// unsettled consumption) is charged with the fetch, the first
			// call for the key once Redis is back: its claim (see charge)
			// counts only while nothing else wrote the bucket since the
			// outage began.
			if e.Pending.Load() > 0 && !ahead {
				r.charge(e, &s)
			}
			if !ahead && (s.Want > s.MinGrant || s.Consumed > 0) {
				s.Instance, s.Seq = r.fetchID, r.fetchSeq.Add(1)
			}
		}
	} else if sp.Mode == Optimistic {
		// An optimistic key's budget is renewed once its consumption is
		// charged: the fetch charges it, as a round would. A key with a
		// view also asks for tokens out of the bucket, up to its cap, at
		// least what the request lacks: granted, they are prepaid budget
		// (see charge), exact however many instances spend the key, and
		// not granted, the budget is renewed by its share (Budget). The
		// fetch is numbered, as a lease fetch is, so that a lost reply
		// neither charges twice nor loses its grant.
		r.charge(e, &s)
		r.adopt(&s, sp)
		if bal := e.Allowance.Load(); !first && bal < cost && r.live.Load() > 1 {
			// A lone instance's share is the whole bucket: it needs no
			// grant. Grants are whole tokens; a budget's share may hold a
			// fraction of one, which a grant replaces (see apply): the
			// bucket still holds it, since shares take nothing out of it.
			// The grant takes only what the bucket holds beyond the other
			// instances' spending not charged yet (see Others) and beyond
			// the whole tokens of budget left here (a budget is part of the
			// bucket), as far as the last view tells.
			v := e.View()
			whole := bal / local.Micro * local.Micro
			s.MinGrant = (cost - whole + local.Micro - 1) / local.Micro * local.Micro
			spare := v.Tokens + r.Refill(sp, v.Age(r.clock.Now())) - r.Others(e, sp) - s.Consumed + s.Returned - whole
			if want := min(r.Cap(sp)-whole, spare) / local.Micro * local.Micro; want >= s.MinGrant {
				s.Want = want
			} else {
				s.MinGrant = 0
			}
		}
		if s.Consumed > 0 || s.Returned > 0 || s.Want > 0 {
			s.Instance, s.Seq = r.fetchID, r.fetchSeq.Add(1)
		}
	}
	if s.Seq > 0 {
		// A resend too (see markOutage). A fetch for its requests alone is
		// not numbered for it: numbered, a lost reply would leave it in
		// doubt, and the key's next request would wait for it to be sent
		// again rather than ask for what it needs (a cold key writes no
		// pool a hot key's charges need).
		r.markOutage(&s)
	}
	fc := fetchCall{e: e, sp: sp, s: s, o: o, first: first, ahead: ahead, resend: resend}
	if lw == nil {
		rep, err := r.settleOne(sp, s)
		return r.fetched(&fc, rep, err)
	}
	rep, w, err := r.settleNowUntil(lw.ctx, s, &lw.timeout)
	if w == nil {
		rep, err = r.answered(sp, &s, rep, err)
		return r.fetched(&fc, rep, err)
	}
	// The request gave up on the reply: what it brings is applied when it
	// comes, and the key's flight lands then.
	lw.late = true
	late, fl := fc, lw.fl
	apply := func() {
		<-w.done
		rep, err := r.reply(w)
		if broken(callErr(rep, err)) {
			r.stats.resent.Add(1)
			rep, err = r.SettleNow(context.Background(), late.s)
		}
		rep, err = r.answered(late.sp, &late.s, rep, err)
		r.fly(late.e, fl, r.fetched(&late, rep, err))
	}
	if !r.goOwned(apply) {
		apply() // Close is under way: it waits for this request
	}
	if err == ErrNoAnswer {
		r.stats.fetchTimeouts.Add(1)
		return fmt.Errorf("reconcile: fetch %q: %w within %v", e.Key(), ErrNoAnswer, r.cfg.ColdWait)
	}
	return err
}

// fetchCall is a fetch sent: what fetched needs to apply its reply.
type fetchCall struct {
	e                    *Entry
	sp                   *Spec
	s                    global.Settlement
	o                    owner
	first, ahead, resend bool
}

// fetched applies the reply rep (or the error err) to the fetch fc, and
// returns fetch's error.
func (r *Reconciler) fetched(fc *fetchCall, rep global.Reply, err error) error {
	e, sp, s, o, ahead, resend := fc.e, fc.sp, fc.s, fc.o, fc.ahead, fc.resend
	if err != nil {
		switch {
		case s.Seq > 0 && (resend || mayBeApplied(err)):
			if !resend {
				r.stats.uncertain.Add(1)
				o.since = r.clock.Now()
			}
			r.fetchDoubt(doubt{s, o})
		case ahead:
			// A turn taken ahead spent nothing: if Redis charged it, the
			// turn is lost (towards denying).
		case s.Consumed > 0 || s.Returned > 0: // surely not applied: settled later
			r.putBack(s.Key, o, s.Consumed, s.Returned)
			r.unclaim(&s, o)
		}
		return fmt.Errorf("reconcile: fetch %q: %w", e.Key(), err)
	}
	if rep.Duplicate {
		r.stats.duplicates.Add(1)
		r.superseded(&s, o, &rep)
	}
	if sp.Mode == Optimistic && fc.first { // the first budget is a share of the bucket
		if r.young() {
			r.recount()
		} else {
			r.awaitCount()
		}
	}
	now := r.clock.Now()
	r.apply(&s, o, &rep, now)
	if ahead {
		r.tookAhead(e, sp, s.Consumed-rep.Forgiven, rep.Tokens, now)
	}
	return nil
}

// adopt adds to s, a settlement of an optimistic key, what an earlier entry
// of the key left to settle when it left the store (its orphan), if the
// orphan is under the same limit: the budget that s brings must be a share
// of a bucket that holds that consumption already, not of one that will be
// charged it at the next round.
func (r *Reconciler) adopt(s *global.Settlement, sp *Spec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.orphans[s.Key]
	if !ok || o.spec != sp {
		return
	}
	delete(r.orphans, s.Key)
	r.norphans.Add(-1)
	r.orphanConsumed -= o.consumed
	s.Consumed += o.consumed
	s.Returned += o.returned
}

// awaitCharge claims the charging of e's key (State.claimCharge), waiting
// while a round holds it until the round's reply has been applied, as long
// as the round makes progress (see awaitRound), and reports whether it did,
// with how long it waits without progress. While it waits, the key is
// marked for the requests that wait for the fetch (see Fetch).
func (r *Reconciler) awaitCharge(e *Entry) (time.Duration, bool) {
	if e.X.claimCharge() {
		return 0, true
	}
	e.X.flags.Or(flagAwaiting)
	defer e.X.flags.And(^flagAwaiting)
	return r.roundWait(e), r.awaitRound(context.Background(), e, e.X.claimCharge, noDeadline)
}

// fetchDoubt keeps d, a fetch without a reply, for the key's next fetch or
// round to send again, unless a newer fetch of the key is in doubt already:
// that one went to Redis after d, so d would read as superseded (it is
// dropped, and the grant it may have got with it).
//
// The fetch not kept would read as superseded if sent again: what it
// charged is charged again (see superseded).
func (r *Reconciler) fetchDoubt(d doubt) {
	r.mu.Lock()
	old, ok := r.fetchDoubts[d.s.Key]
	gone := d
	if !ok || old.s.Seq < d.s.Seq {
		r.fetchDoubts[d.s.Key] = d
		gone = old
	}
	r.nfetchDoubts.Store(int64(len(r.fetchDoubts)))
	r.mu.Unlock()
	if ok {
		r.unapplied(&gone.s, gone.o)
	}
}

// superseded charges again what s charged when rep says Redis read it as a
// duplicate of a settlement superseded since (global.Reply.Superseded): a
// fetch in doubt sent again after a newer fetch of its key went first, and
// so perhaps never applied.
func (r *Reconciler) superseded(s *global.Settlement, o owner, rep *global.Reply) {
	if rep.Superseded {
		r.unapplied(s, o)
	}
}

// unapplied puts back the consumption of s, a settlement that may or may
// not have been applied and will not be sent again: charged again at the
// next round, twice if it was applied, which errs towards denying; never
// lost, which would let the fleet admit it again. What it gave back and
// claimed is dropped (given twice, it would let the fleet admit more than
// the bucket).
func (r *Reconciler) unapplied(s *global.Settlement, o owner) {
	r.stats.unapplied.Add(1)
	if s.Consumed > 0 {
		r.putBack(s.Key, o, s.Consumed, 0)
	}
}

// settleOne settles s, of a key of sp, now, in the batch of its node
// (SettleNow), and counts a failure, or records what it took (Took). s
// takes nothing out of its entry (it charges and gives back
// nothing), so a failure has nothing to put back.
func (r *Reconciler) settleOne(sp *Spec, s global.Settlement) (global.Reply, error) {
	rep, err := r.SettleNow(context.Background(), s)
	return r.answered(sp, &s, rep, err)
}

// answered is settleOne once SettleNow returned rep and err for s.
func (r *Reconciler) answered(sp *Spec, s *global.Settlement, rep global.Reply, err error) (global.Reply, error) {
	if err = callErr(rep, err); err != nil {
		r.stats.fetchErrors.Add(1)
		r.stats.keyErrors.Add(1)
		return rep, err
	}
	r.Took(sp, s, &rep)
	return rep, nil
}

// Take asks Redis for cost micro-tokens of e's key for one request alone,
// now, and reports whether they were granted: the way a request gets its
// tokens when concurrent requests spent every lease a fetch brought. It waits
// at most Config.ColdWait and no longer than ctx; a grant that arrives after
// the caller gave up joins e's allowance.
func (r *Reconciler) Take(ctx context.Context, e *Entry, cost int64) (bool, error) {
	return r.TakeBy(ctx, e, cost, r.ColdBy())
}

// TakeBy is Take for a request that must be answered by the clock reading
// by (see ColdBy).
func (r *Reconciler) TakeBy(ctx context.Context, e *Entry, cost int64, by time.Duration) (bool, error) {
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
	t := r.timer(r.left(by))
	defer r.putTimer(t)
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
	s := global.Settlement{Key: e.Key(), Limit: sp.Limit, Debt: r.debt(sp), Want: cost, MinGrant: cost, Quantum: local.Micro}
	rep, err := r.settleOne(sp, s)
	if err != nil {
		decided.Store(true)
		return false, fmt.Errorf("reconcile: take %q: %w", e.Key(), err)
	}
	r.stats.keysSettled.Add(1)
	if rep.Reset {
		r.stats.resets.Add(1)
	}
	r.observe(e, &s, &rep)
	r.SetView(e, local.View{Tokens: rep.Tokens, Seen: r.clock.Now()})
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
