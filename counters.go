package hybrid

import "sync/atomic"

// counters are the Limiter's own statistics. Only decisions off the hot path
// are counted here, so that an allowed decision on a known key writes no
// memory shared across keys: those are counted by the spend itself, in the
// key's allowance (see local.Allowance), and summed by the reconciler.
type counters struct {
	localDenied      atomic.Uint64
	trusted          atomic.Uint64 // first requests of optimistic keys, admitted on trust (local decisions)
	redisAllowed     atomic.Uint64
	redisDenied      atomic.Uint64
	unanswered       atomic.Uint64
	fetched          atomic.Uint64
	fallbackAllowed  atomic.Uint64
	fallbackDenied   atomic.Uint64
	fallbackConsumed atomic.Uint64 // micro-tokens
	fallbackCrowded  atomic.Uint64
	exactAllowed     atomic.Uint64
	exactDenied      atomic.Uint64
	exactErrors      atomic.Uint64
	exactResets      atomic.Uint64
	refunds          atomic.Uint64
}
