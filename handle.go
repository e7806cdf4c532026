package hybrid

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Handle is one key bound to one limit, for a key that a large share of
// requests ask: a per-service or per-tenant limit, a hot API route. Its
// decisions are Limiter.AllowN's on the same key and limit, on the same
// shadow bucket and settled the same way, and the two can be mixed freely;
// a Handle only keeps the key's entry between decisions, so that a decision
// from the allowance skips hashing and looking up the key (about a third of
// its time, docs/tuning.md). If the entry leaves the Limiter (evicted to
// make room for other keys, or its limit changed), the next decision looks
// the key up again.
//
// A Handle is safe for concurrent use; make one per key and keep it, as
// one would a golang.org/x/time/rate Limiter. It holds nothing that needs
// closing: it stops working when its Limiter is closed.
type Handle struct {
	l    *Limiter
	key  string
	lim  Limit
	hash uint64                          // key's hash in the Limiter's store
	e    atomic.Pointer[reconcile.Entry] // the entry of the last decision, or nil
}

// Handle returns a Handle for key under lim. It checks both now, and returns
// ErrInvalidKey or ErrInvalidLimit (wrapped) if either is not valid.
func (l *Limiter) Handle(key string, lim Limit) (*Handle, error) {
	if err := limit.CheckKey(key); err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	if _, err := l.spec(lim); err != nil {
		return nil, fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	return &Handle{l: l, key: key, lim: lim, hash: l.keys.Hash(key)}, nil
}

// Key returns the key h decides.
func (h *Handle) Key() string { return h.key }

// Limit returns the limit h decides under.
func (h *Handle) Limit() Limit { return h.lim }

// Allow is AllowN(ctx, 1).
func (h *Handle) Allow(ctx context.Context) (Result, error) { return h.AllowN(ctx, 1) }

// AllowN reports whether n tokens may be taken now, and takes them if so:
// Limiter.AllowN(ctx, h.Key(), h.Limit(), n).
func (h *Handle) AllowN(ctx context.Context, n int64) (res Result, err error) {
	old := h.e.Load()
	if old != nil {
		if !h.l.keys.Fresh(old) {
			h.l.keys.Touch(old, h.hash) // its recency, as a lookup would
		}
		if _, ok := h.l.fast(&res, h.key, h.lim, n, old); ok {
			return res, nil
		}
	}
	res, e, err := h.l.slow(ctx, h.key, h.lim, n, old)
	if e != nil && e != old {
		h.e.Store(e)
	}
	return res, err
}

// Wait is Limiter.Wait(ctx, h.Key(), h.Limit()).
func (h *Handle) Wait(ctx context.Context) error { return h.l.WaitN(ctx, h.key, h.lim, 1) }

// WaitN is Limiter.WaitN(ctx, h.Key(), h.Limit(), n).
func (h *Handle) WaitN(ctx context.Context, n int64) error {
	return h.l.WaitN(ctx, h.key, h.lim, n)
}

// Peek is Limiter.Peek(ctx, h.Key(), h.Limit(), n).
func (h *Handle) Peek(ctx context.Context, n int64) (Result, error) {
	return h.l.Peek(ctx, h.key, h.lim, n)
}

// Reserve is Limiter.Reserve(ctx, h.Key(), h.Limit(), n).
func (h *Handle) Reserve(ctx context.Context, n int64) (*Reservation, error) {
	return h.l.Reserve(ctx, h.key, h.lim, n)
}
