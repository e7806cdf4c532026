package hybrid

import (
	"context"
	"fmt"

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
	// checks. When a check denies, the checks after it are not decided and
	// Results ends with the denying one.
	Results []Result
	// Denied is the index of the check that denied, or -1 if Allowed.
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
// When a check denies, the tokens already taken for the checks before it are
// given back, in this instance's allowance and in Redis alike (as Cancel does),
// so a denied request consumes nothing in any tier. Checks are decided in
// order: put the tier most likely to deny first. Between a check and the
// give-back, its tokens are briefly unavailable to other requests.
//
// Every check is validated before any is decided: an invalid key, limit or
// cost is an error naming its tier, with nothing taken.
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
	d := Decision{Allowed: true, Results: make([]Result, 0, len(checks)), Denied: -1}
	var buf [4]Reservation
	taken := buf[:0]
	for i := range checks {
		c := &checks[i]
		res, e, err := l.decide(ctx, c.Key, c.Limit, cost(c), entries[i])
		if err != nil {
			l.giveBack(taken)
			return Decision{Denied: -1}, fmt.Errorf("hybrid: tier %q: %w", c.Tier, err)
		}
		d.Results = append(d.Results, res)
		if !res.Allowed {
			l.giveBack(taken)
			d.Allowed, d.Denied = false, i
			return d, nil
		}
		r := Reservation{l: l, key: c.Key, e: e, res: res, cost: cost(c) * local.Micro}
		if e != nil {
			r.sp = e.X.Spec()
		}
		taken = append(taken, r)
	}
	return d, nil
}

// giveBack refunds the reservations of a composite decision that failed.
func (l *Limiter) giveBack(taken []Reservation) {
	for i := range taken {
		l.refund(&taken[i])
	}
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
