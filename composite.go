package hybrid

import (
	"context"
	"fmt"

	"github.com/hybridlimit/hybrid/global"

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
// Consecutive checks that need Redis (exact limits, and lease limits of keys
// this instance holds nothing for) go in one script call on a single Redis,
// all or nothing: they take their tokens together or none of them, so a
// denial among them needs no give-back, and the composite costs one round
// trip. Should that call fail, they are decided one by one.
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
	for i := 0; i < len(checks); i++ {
		// A run of checks that need Redis goes in one call, all or nothing.
		if j := l.run(checks, entries, i); j-i >= 2 {
			var ok bool
			if taken, ok = l.together(ctx, &d, taken, checks[i:j], i); ok {
				if !d.Allowed {
					l.giveBack(taken)
					return d, nil
				}
				i = j - 1
				continue
			}
		}
		c := &checks[i]
		res, e, err := l.decide(ctx, c.Key, c.Limit, checkCost(c), entries[i])
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
		r := Reservation{l: l, key: c.Key, e: e, res: res, cost: checkCost(c) * local.Micro}
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

// checkCost is c's cost in tokens: 1 when it names none.
func checkCost(c *Check) int64 {
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
			if n := checkCost(c); n >= 1 && n <= sp.Limit.Burst/local.Micro {
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
	if _, err := sp.Limit.Cost(checkCost(c)); err != nil {
		return fmt.Errorf("hybrid: tier %q: key %q: %w", c.Tier, c.Key, err)
	}
	return nil
}

// run returns the end of the run of checks from i that need Redis and can
// go in one all-or-nothing call (together): exact checks, and lease checks of
// keys this instance holds nothing for and has no view of, on a single Redis
// whose breaker is closed. A check it holds an allowance or a view for is
// decided here, in order, as before.
func (l *Limiter) run(checks []Check, entries []*reconcile.Entry, i int) int {
	if l.g.Spread() || l.r.Degraded() {
		return i
	}
	j := i
	for ; j < len(checks); j++ {
		c, e := &checks[j], entries[j]
		switch c.Limit.Mode {
		case Exact:
		case Lease:
			if e != nil && (e.Allowance.Load() > 0 || e.View().Seen != 0) {
				return j
			}
		default:
			return j
		}
		for k := i; k < j; k++ {
			if checks[k].Key == c.Key {
				return j // a key once in a call
			}
		}
	}
	return j
}

// together decides checks, whose first is the check at index at of the
// composite, in one all-or-nothing script call (global.Limiter.SettleAll):
// every one takes its cost from its bucket in Redis, or none does. It
// appends their Results to d up to the first that denies, as deciding them
// in order would (those before it would have passed: nothing was taken from
// them, and nothing is given back), and their reservations to taken. ok is
// false, with nothing decided, if the call failed: the caller decides them
// one by one.
func (l *Limiter) together(ctx context.Context, d *Decision, taken []Reservation, checks []Check, at int) (_ []Reservation, ok bool) {
	type member struct {
		e    *reconcile.Entry
		sp   *reconcile.Spec
		glim global.Limit
	}
	var mbuf [4]member
	ms := mbuf[:0]
	sets := make([]global.Settlement, 0, len(checks))
	for i := range checks {
		c := &checks[i]
		sp, err := l.spec(c.Limit)
		if err != nil {
			return taken, false
		}
		e, _ := l.keys.GetOrAdd(c.Key)
		if e.X.Spec() != sp {
			l.setSpec(e, sp)
		}
		glim := global.Limit{Rate: sp.Rate, Burst: sp.Limit.Burst / local.Micro}
		s, err := global.Decision(c.Key, glim, checkCost(c))
		if err != nil {
			return taken, false
		}
		ms = append(ms, member{e, sp, glim})
		sets = append(sets, s)
	}
	replies := make([]global.Reply, len(sets))
	err := l.r.Do(ctx, checks[0].Key, func(ctx context.Context) error {
		return l.g.SettleAll(ctx, sets, replies)
	})
	if err != nil {
		return taken, false
	}
	for i := range replies {
		l.r.Took(ms[i].sp, &sets[i], &replies[i]) // if Redis loses the write, charged again
	}
	granted := replies[0].Granted > 0
	if !granted {
		short := false
		for i := range replies {
			short = short || replies[i].Tokens < sets[i].Want
		}
		if !short {
			return taken, false // nothing granted and no bucket short: not the script's answer
		}
	}
	now := l.clock.Now()
	for i := range checks {
		c, m, rep := &checks[i], &ms[i], &replies[i]
		gr := global.Outcome(sets[i], m.glim, *rep)
		if !granted && rep.Tokens >= sets[i].Want {
			// It would have passed; a check after it denied.
			gr.Allowed, gr.RetryAfter = true, 0
			gr.Remaining = (rep.Tokens - sets[i].Want) / local.Micro
		}
		var res Result
		if m.sp.Mode == Exact {
			res = l.decided(m.e, c.Limit, gr)
		} else {
			l.r.Observe(m.e, &sets[i], rep) // before the view it reads changes
			l.r.SetView(m.e, local.View{Tokens: rep.Tokens, Seen: now})
			if gr.Allowed {
				res = l.allowed(m.e, m.sp, c.Limit, m.e.Allowance.Load(), SourceRedis)
			} else {
				l.stats.redisDenied.Add(1)
				res = l.denied(m.sp, c.Limit, untilHolds(m.sp, m.e.View(), sets[i].Want, now), m.e.View(), 0, SourceRedis)
			}
		}
		d.Results = append(d.Results, res)
		if !res.Allowed {
			d.Allowed, d.Denied = false, at+i
			return taken, true
		}
		if granted {
			taken = append(taken, Reservation{l: l, key: c.Key, e: m.e, sp: m.sp, res: res, cost: sets[i].Want})
		}
	}
	return taken, true
}
