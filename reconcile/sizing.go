package reconcile

import (
	"math"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
)

// resize adapts the allowance e keeps in lease mode to its use: double it if
// it was starved since the last round, halve it if less than a quarter of it
// is used (more than three quarters of it are left, and the spends since
// the last round, used micro-tokens at least, took less than a quarter: a
// lease fetched since is not too large for being full) (the gap between
// the two keeps a steady key from swinging), but for a key others take
// too, whose lease is two turns at most (LeaseCap) and lasts as long as
// its turns take, many rounds;
// within [one token, LeaseCap]. It returns it in micro-tokens.
func (r *Reconciler) resize(e *Entry, sp *Spec, bal, used int64, starved bool) int64 {
	t := r.target(e, sp)
	if starved {
		t *= 2
		if n := r.Takers(e); n > 1 {
			t = max(t, r.turn(sp, n)) // a key the fleet shares: its turn at once
		}
	} else if bal > t/4*3 && used < t/4 && r.Takers(e) == 1 {
		t /= 2
	}
	t = min(max(t-t%local.Micro, local.Micro), r.LeaseCap(e, sp)) // whole tokens
	e.X.target.Store(uint32(t / local.Micro))
	return t
}

// target returns the allowance e keeps in lease mode, in micro-tokens: its
// last size, or for a key never sized one token. A key's first fetch so
// reserves what its request needs and nothing more: a key asked a few times
// a minute, as most per-user keys are, leaves nothing to give back. A key
// in demand grows its lease from there, doubling at each fetch that finds
// it run dry (resize).
func (r *Reconciler) target(e *Entry, sp *Spec) int64 {
	if t := int64(e.X.target.Load()) * local.Micro; t > 0 {
		return t
	}
	return local.Micro
}

// debt returns the most a charge may leave sp's bucket owing
// (global.Settlement.Debt), in micro-tokens: Config.MaxDebt's worth of its
// refill, at least its burst, at most global.MaxDebt.
func (r *Reconciler) debt(sp *Spec) int64 {
	d := float64(sp.Limit.Rate) * r.cfg.MaxDebt.Seconds()
	if d >= global.MaxDebt {
		return global.MaxDebt
	}
	return max(int64(d), sp.Limit.Burst)
}

// Debt returns the most micro-tokens a bucket of sp may owe: the refill of
// Config.MaxDebt, the burst at least, 2^50 at most. A charge never sinks a
// bucket further, and a take ahead (global.Limiter.TakeAhead) never owes
// more.
func (r *Reconciler) Debt(sp *Spec) int64 { return r.debt(sp) }

// maxLease is the most allowance a key holds, in whole tokens.
func (r *Reconciler) maxLease(sp *Spec) int64 { return min(r.lc, sp.Limit.Burst) }

// Budget returns the optimistic budget of a key that has old micro-tokens of
// budget left, whose global bucket held tokens micro-tokens, elapsed after
// its previous settlement: its share of what the bucket refilled meanwhile
// added to what it has left, or its share of what the bucket holds if that
// is more, within Cap. Fractions of a token carry over, so that a fleet
// larger than the burst still spends the whole refill.
func (r *Reconciler) Budget(sp *Spec, tokens, old int64, elapsed time.Duration) int64 {
	n := r.live.Load()
	refill, _ := limit.Refill(elapsed, sp.Limit.Rate, 0)
	return min(max(old+refill/n, max(tokens, 0)/n), r.Cap(sp))
}

// Cap is the most optimistic budget one instance holds for a key: its share
// of the burst and of one interval's refill, at least one token, within
// LocalCapacity and the burst.
func (r *Reconciler) Cap(sp *Spec) int64 {
	n := r.live.Load()
	refill, _ := limit.Refill(r.cfg.SyncInterval, sp.Limit.Rate, 0)
	return min(r.lc, sp.Limit.Burst, max((sp.Limit.Burst+refill)/n, local.Micro))
}

// LeaseSize returns the allowance e keeps in lease mode, in micro-tokens.
func (r *Reconciler) LeaseSize(e *Entry, sp *Spec) int64 { return r.target(e, sp) }

// Refill returns the micro-tokens sp's bucket refills in d.
func (r *Reconciler) Refill(sp *Spec, d time.Duration) int64 {
	add, _ := limit.Refill(d, sp.Limit.Rate, 0)
	return add
}

// BudgetWait returns how long after a settlement of a key, whose bucket then
// held tokens micro-tokens (less this instance's spending not charged since)
// and whose budget here holds old micro-tokens, the next settlement would
// renew the budget to at least need micro-tokens by Budget's rule: when its
// share of the refill, or of what the bucket holds, covers need. A need
// above Cap is never met: the result is the longest Duration.
func (r *Reconciler) BudgetWait(sp *Spec, tokens, old, need int64) time.Duration {
	if need > r.Cap(sp) {
		return math.MaxInt64
	}
	n := r.live.Load()
	refill := limit.DurationFor(n*(need-old), sp.Limit.Rate)
	if n > 1 {
		// Not the share of what the bucket holds: the budgets the fleet's
		// instances hold are in it too, charged later, and an instance
		// that came back for it at once would come as often as the
		// bucket looks full, not as its share of the refill accrues.
		// What it holds is its share at the next settlement all the same.
		return refill
	}
	return min(refill, limit.DurationFor(n*need-tokens, sp.Limit.Rate))
}

// Lead returns how long before tokens are due in a key's bucket a request
// may ask Redis for them: the time it takes to reach Redis, half the last
// round trip, at most maxLead. A request sent when they are due would find
// a bucket that refilled for that long more, and a full bucket refills
// nothing.
func (r *Reconciler) Lead() time.Duration {
	return min(time.Duration(r.stats.rtt.Load())/2, maxLead)
}

// maxLead bounds Lead: a round trip stretched by a loaded machine says
// little of the next one.
const maxLead = 250 * time.Microsecond

// Others returns what the other instances of the fleet may have spent of
// e's key (of sp) and not yet charged, as this instance counts them: a
// budget cap each, or none while its replies show that nobody else writes
// the key's bucket (see Askers). An optimistic grant takes only what the
// bucket holds beyond it, since the bucket does not hold those charges yet:
// a grant of the tokens they spent would count them twice.
//
// An instance alone on a key takes the whole bucket: with a burst below the
// others' caps, no grant could come otherwise, and it would get its share
// of the refill alone, R/N. What the others could still spend without
// charging (a budget they kept, a first request admitted on trust) may
// overlap with such a grant: a debt the bucket repays, within the bound
// that shares already have (docs/accuracy.md). Their next charge, seen in
// the replies, ends the instance's being alone, for a quiet spell at least
// (see quiet).
func (r *Reconciler) Others(e *Entry, sp *Spec) int64 {
	return (r.Askers(e) - 1) * r.Cap(sp)
}

// settleDue reports whether a round settles e's optimistic key, touched
// since the last round or held from an earlier one, at now. A key's
// settlements follow its use, not the rounds: it is settled once its turn
// comes, the fleet's settlements of the key about one per turnTime as a
// lease key's turns are, or once its view is staleAge old. A key the
// instance barely uses is so settled rarely; one whose budget runs dry
// settles on demand, when its share of the refill covers the request, or
// for a fleet so large that the key's turns come staleAge apart, when it
// brings the instance's share of the burst (hybrid's optimistic path); one
// that such a fleet saturates, about once per B/R for each instance:
// N·R/B calls a second, the floor (docs/tuning.md, "Fleet size").
//
// Not sooner: a settlement before its turn would renew the budget by its
// share of what the bucket holds rather than of the refill, and what the
// bucket holds counts the fleet's spending not charged yet
// (docs/accuracy.md, the debt D); nor when the view and its refill add up
// to a full bucket, since the others' charges land between this
// instance's replies. Settled so too (once half its cap was spent
// unsettled, or its bucket full as its view told), a key saturated by
// 1,024 instances cost 2.8 times the floor.
func (r *Reconciler) settleDue(e *Entry, sp *Spec, now time.Duration) bool {
	v := e.View()
	return v.Seen == 0 || v.Age(now) >= min(r.staleAge(sp), time.Duration(r.live.Load())*r.turnTime())
}

// staleAge is the longest an optimistic key in use goes unsettled: the time
// its bucket takes to refill, within one interval and ten.
func (r *Reconciler) staleAge(sp *Spec) time.Duration {
	return min(max(sp.Duration(sp.Limit.Burst), r.cfg.SyncInterval), 10*r.cfg.SyncInterval)
}
