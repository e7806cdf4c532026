package rls

import (
	"context"

	"github.com/hybridlimit/hybrid"
)

// decideEach decides every limited descriptor on its own, in order, as the
// original does (Config.Independent): each takes its hits if its limit
// has them, whatever the others decide.
func (s *Server) decideEach(ctx context.Context, items []item) error {
	for i := range items {
		if it := &items[i]; it.kind == limited {
			if err := s.alone(ctx, it, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// decideTogether decides the limited descriptors of a request all or
// nothing:
//
//  1. the enforced descriptors (neither shadow nor quota mode) that take
//     no tokens, or can never have them, are decided first: a check (0
//     hits), a request of more hits than its limit holds, a limit of 0;
//  2. if none of them refused the request, the quota-mode descriptors are
//     charged, each on its own, as in the original, and the request is
//     refused if every one of them is over its limit;
//  3. if nothing refused it yet, the other enforced descriptors are decided
//     together (hybrid.Limiter.AllowAll): all of them take their hits, or
//     none does;
//  4. the shadow-mode descriptors are charged, each on its own, if the
//     request goes ahead, and only read if it is refused: a shadow limit
//     counts the requests that passed the others, as it would were it
//     enforced, and never refuses one.
//
// A descriptor left undecided because the request was refused already, or
// whose hits a refusal gave back, is read (hybrid.Limiter.Peek) for its
// status, and takes nothing.
func (s *Server) decideTogether(ctx context.Context, items []item) error {
	refused := false
	for i := range items {
		if it := &items[i]; it.enforced() && !it.takes() {
			if err := s.alone(ctx, it, false); err != nil {
				return err
			}
			refused = refused || it.over
		}
	}
	quotas, quotasOver := 0, 0
	for i := range items {
		it := &items[i]
		if it.kind != limited || !it.quota {
			continue
		}
		quotas++
		if it.shadow {
			continue // never over: decided with the shadow ones
		}
		if err := s.alone(ctx, it, !refused); err != nil {
			return err
		}
		if it.over {
			quotasOver++
		}
	}
	refused = refused || quotas > 0 && quotasOver == quotas
	var err error
	if refused, err = s.together(ctx, items, refused); err != nil {
		return err
	}
	for i := range items {
		if it := &items[i]; it.kind == limited && it.shadow {
			if err := s.alone(ctx, it, !refused); err != nil {
				return err
			}
		}
	}
	return nil
}

// together decides the enforced descriptors that take tokens in one
// composite decision, unless the request is refused already, in which
// case it reads them. It returns whether the request is refused.
func (s *Server) together(ctx context.Context, items []item, refused bool) (bool, error) {
	var (
		cbuf   [4]hybrid.Check
		gbuf   [4]int
		checks = cbuf[:0]
		group  = gbuf[:0] // the items' indices
	)
	for i := range items {
		if it := &items[i]; it.enforced() && it.takes() {
			group = append(group, i)
			checks = append(checks, hybrid.Check{Key: it.key, Limit: it.b.limit, Cost: it.cost()})
		}
	}
	if len(group) == 0 {
		return refused, nil
	}
	if len(group) == 1 && !refused { // AllowAll of one check, without its Decision
		it := &items[group[0]]
		err := s.alone(ctx, it, true)
		return it.over, err
	}
	if refused {
		for _, i := range group {
			if err := s.alone(ctx, &items[i], false); err != nil {
				return true, err
			}
		}
		return true, nil
	}
	d, err := s.lim.AllowAll(ctx, checks...)
	if err != nil {
		return true, err
	}
	for j, i := range group {
		it := &items[i]
		switch {
		case d.Allowed:
			it.took(d.Results[j])
		case j == d.Denied:
			it.refused(d.Results[j])
		default:
			// Given its hits back, or not decided (a check before it
			// refused the request): its bucket holds what it held, which
			// a read says. The composite's Result of a check that passed
			// in a refused request is no status for it: it tells the
			// bucket after tokens that are back.
			if err := s.alone(ctx, it, false); err != nil {
				return true, err
			}
		}
	}
	return !d.Allowed, nil
}

// alone decides it on its own. With charge it takes the request's hits if
// the limit has them; without, it only reads the bucket, and it.over says
// whether the hits are there (a descriptor of a refused request, which
// takes nothing). A descriptor that takes no tokens is read either way: a
// check (0 hits) is over if one more request would be; a refund is never
// over; a request of more hits than the limit holds, and any request of a
// limit of 0, always is.
func (s *Server) alone(ctx context.Context, it *item, charge bool) error {
	if it.b.n == 0 { // requests_per_unit 0
		it.over, it.before, it.remaining, it.reset = true, 0, 0, it.m.Limit.Unit.Duration()
		return nil
	}
	var (
		need int64 // tokens a read asks about
		res  hybrid.Result
		err  error
	)
	switch {
	case it.refund, it.hits > uint64(it.b.n):
		need = 0 // the state alone: the verdict is known
	case it.hits == 0:
		need = it.b.scale // one request's worth
	case charge:
		if res, err = s.lim.AllowN(ctx, it.key, it.b.limit, it.cost()); err != nil {
			return err
		}
		if res.Allowed {
			it.took(res)
		} else {
			it.refused(res)
		}
		return nil
	default:
		need = it.cost()
	}
	if res, err = s.lim.Peek(ctx, it.key, it.b.limit, need); err != nil {
		return err
	}
	it.read(res)
	if need == 0 {
		it.over = !it.refund // a request above its limit is over
	}
	return nil
}

// enforced reports whether it is a limit that refuses requests: not
// shadow, not quota mode.
func (it *item) enforced() bool { return it.kind == limited && !it.shadow && !it.quota }

// takes reports whether a decision on it takes tokens: not a limit of 0,
// not a refund, not a check, not a request above the limit.
func (it *item) takes() bool {
	return it.b.n > 0 && !it.refund && it.hits > 0 && it.hits <= uint64(it.b.n)
}

// cost is the tokens of the request's hits. It is only asked of an item
// that takes tokens, whose hits are at most its limit's.
func (it *item) cost() int64 { return int64(it.hits) * it.b.scale }

// took records a decision that took the request's hits.
func (it *item) took(res hybrid.Result) {
	it.over = false
	it.remaining = res.Remaining / it.b.scale
	it.before = min(it.remaining+int64(it.hits), it.b.n)
	it.reset = res.ResetAfter
}

// refused records a decision that refused the request: it took nothing.
func (it *item) refused(res hybrid.Result) {
	it.over = true
	it.remaining = res.Remaining / it.b.scale
	it.before = it.remaining
	it.reset = res.ResetAfter
}

// read records a read of the bucket that took nothing: it.over is whether
// the tokens asked about are there.
func (it *item) read(res hybrid.Result) {
	it.over = !res.Allowed
	it.remaining = res.Remaining / it.b.scale
	it.before = it.remaining
	it.reset = res.ResetAfter
}
