package hybrid

import (
	"context"
	"fmt"
	"sync"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Check is one tier of a composite decision: Cost tokens of Key under Limit.
// Tier names it in results and errors ("user", "api-key", "endpoint",
// "global"); it may be empty.
type Check struct {
	Tier  string
	Key   string
	Limit Limit
	// Cost is the tokens the request takes from this tier. 0 means 1.
	Cost int64
}

// Decision is the outcome of AllowAll.
type Decision struct {
	// Allowed reports whether every check passed, and so whether the
	// tokens of every check were taken.
	Allowed bool
	// Results has one Result per check decided, in the order of the
	// checks, from the first: every check, unless one was denied from this
	// instance's last view of its bucket (see AllowAll), which ends them.
	Results []Result
	// Denied is the index of the first check that denied, or -1 if Allowed.
	Denied int
}

// Result returns the result that speaks for the decision: the denying
// check's when denied, else the allowed check with the fewest tokens
// remaining (the tier that will deny first). It is the zero Result when
// there were no checks.
func (d Decision) Result() Result {
	if d.Denied >= 0 && d.Denied < len(d.Results) {
		return d.Results[d.Denied]
	}
	var best Result
	for i, r := range d.Results {
		if i == 0 || r.Remaining < best.Remaining {
			best = r
		}
	}
	return best
}

// AllowAll decides a request against several tiers at once: it is allowed
// only if every check passes, and then the tokens of every check are taken.
// When a check denies, the tokens taken for the others are given back, in
// this instance's allowance and in Redis alike (as Cancel does), so a
// denied request consumes nothing in any tier. Between a check and the
// give-back, its tokens are briefly unavailable to other requests.
//
// The checks this instance can decide from its allowances are decided first,
// in order, at no cost; the others, which need Redis (exact limits, keys it
// holds nothing for), are decided together: they go in the same batch of
// their Redis node (one round trip; on a single Redis one script call), and
// so do the give-backs of a denied request. A check this instance can deny
// from its last view of the bucket (a lease key whose bucket it saw short)
// leaves the checks after it undecided.
//
// Every check is validated before any is decided: an invalid key, limit or
// cost is an error naming its tier, with nothing taken. Results has the
// Result of every check decided, in the order of the checks: of them all,
// unless one was denied from this instance's view, which ends them.
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	var ebuf [4]*reconcile.Entry
	entries := ebuf[:0]
	for i := range checks {
		e := l.keys.Get(checks[i].Key)
		if err := l.validCheck(&checks[i], e); err != nil {
			return Decision{Denied: -1}, err
		}
		entries = append(entries, e)
	}
	var tbuf [4]tier
	tiers := tbuf[:0]
	for range checks {
		tiers = append(tiers, tier{})
	}
	// From the allowances and views first: the checks after a denial there
	// are not decided.
	var rbuf [4]int
	remote := rbuf[:0]
	for i := range checks {
		c := &checks[i]
		if res, e, ok := l.fast(c.Key, c.Limit, cost(c), entries[i]); ok {
			tiers[i] = tier{res: res, e: e, done: true}
			continue
		}
		if res, ok := l.viewDenies(c, entries[i]); ok {
			// Denied: the checks after it are not decided; those before
			// it that need Redis are (Results has them), and given back.
			tiers[i] = tier{res: res, done: true}
			break
		}
		remote = append(remote, i)
	}
	switch len(remote) {
	case 0:
	case 1:
		i := remote[0]
		c := &checks[i]
		res, e, err := l.decide(ctx, c.Key, c.Limit, cost(c), entries[i])
		tiers[i] = tier{res: res, e: e, err: err, done: true}
	default:
		// Together, so that they meet in one batch of each node.
		var wg sync.WaitGroup
		for _, i := range remote {
			wg.Go(func() {
				c := &checks[i]
				res, e, err := l.decide(ctx, c.Key, c.Limit, cost(c), entries[i])
				tiers[i] = tier{res: res, e: e, err: err, done: true}
			})
		}
		wg.Wait()
	}
	d := Decision{Allowed: true, Results: make([]Result, 0, len(checks)), Denied: -1}
	var failed error
	for i := range checks {
		t := &tiers[i]
		switch {
		case !t.done: // after a denial from a view: the rest are not decided
		case t.err != nil:
			if failed == nil {
				failed = fmt.Errorf("hybrid: tier %q: %w", checks[i].Tier, t.err)
			}
		default:
			d.Results = append(d.Results, t.res)
			if !t.res.Allowed && d.Allowed {
				d.Allowed, d.Denied = false, i
			}
		}
	}
	if failed == nil && d.Allowed {
		return d, nil
	}
	l.giveBack(checks, tiers)
	if failed != nil {
		return Decision{Denied: -1}, failed
	}
	return d, nil
}

// viewDenies reports whether check c, whose entry e holds too little
// allowance for it, is denied from e's view of its bucket, without a round
// trip, and returns the denial: a lease key whose fresh view shows the
// bucket short (heldBack).
func (l *Limiter) viewDenies(c *Check, e *reconcile.Entry) (Result, bool) {
	if e == nil || e.Retired() {
		return Result{}, false
	}
	sp := e.X.Spec()
	if sp == nil || sp.Mode != Lease || !sp.Is(c.Limit.Rate, c.Limit.Burst, c.Limit.Mode) || l.r.DegradedKey(c.Key) {
		return Result{}, false
	}
	_, res, denied := l.heldBack(e, sp, c.Limit, cost(c)*local.Micro, l.clock.Now())
	return res, denied
}

// tier is the outcome of one check of AllowAll.
type tier struct {
	res  Result
	e    *reconcile.Entry
	err  error
	done bool
}

// giveBack refunds the checks of a composite decision that failed: those
// that were allowed, together (an exact tier's give-back is a round trip,
// and they meet in one batch).
func (l *Limiter) giveBack(checks []Check, tiers []tier) {
	var rbuf [4]Reservation
	taken := rbuf[:0]
	for i := range tiers {
		t := &tiers[i]
		if !t.done || t.err != nil || !t.res.Allowed {
			continue
		}
		r := Reservation{l: l, key: checks[i].Key, e: t.e, res: t.res, cost: cost(&checks[i]) * local.Micro}
		if t.e != nil {
			r.sp = t.e.X.Spec()
		}
		taken = append(taken, r)
	}
	if len(taken) < 2 {
		for i := range taken {
			l.refund(&taken[i])
		}
		return
	}
	var wg sync.WaitGroup
	for i := range taken {
		wg.Go(func() { l.refund(&taken[i]) })
	}
	wg.Wait()
}

func cost(c *Check) int64 {
	if c.Cost == 0 {
		return 1
	}
	return c.Cost
}

// validCheck reports what is wrong with c before anything is taken. e is
// c.Key's entry, or nil: a key with an entry under c's limit was checked
// when the entry was made.
func (l *Limiter) validCheck(c *Check, e *reconcile.Entry) error {
	if e != nil {
		if sp := e.X.Spec(); sp != nil && sp.Is(c.Limit.Rate, c.Limit.Burst, c.Limit.Mode) {
			if n := cost(c); n >= 1 && n <= sp.Limit.Burst/local.Micro {
				return nil
			}
		}
	}
	if err := limit.CheckKey(c.Key); err != nil {
		return fmt.Errorf("hybrid: tier %q: %w", c.Tier, err)
	}
	sp, err := l.spec(c.Limit)
	if err != nil {
		return fmt.Errorf("hybrid: tier %q: key %q: %w", c.Tier, c.Key, err)
	}
	if _, err := sp.Limit.Cost(cost(c)); err != nil {
		return fmt.Errorf("hybrid: tier %q: key %q: %w", c.Tier, c.Key, err)
	}
	return nil
}
