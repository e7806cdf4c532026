package hybrid

import (
	"cmp"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// What the fallback keeps of the keys that leave the store. A key's local
// bucket under the fallback policy lives in its entry, and an entry leaves
// the store when more keys than Config.MaxKeys are asked: during an outage,
// a key made again would start its share anew at every eviction, and a
// client rotating keys would be limited by nothing. So each entry that
// leaves writes in the Limiter's ledger (local.Ledger, bounded) when its
// share would be full again, and a new entry with no view of its own starts
// from that (see seed).

// ledgerSize is the records of the ledger of a Limiter that tracks maxKeys
// keys (0: the default): twice as many, and at least 65,536 (576 KiB).
func ledgerSize(maxKeys int) int {
	return max(2*cmp.Or(maxKeys, local.DefaultCapacity), 1<<16)
}

// remembered reports whether the ledger holds that an earlier entry of key
// left the store with its share not full yet (or cannot tell it from one
// that did): such a key's first request is not admitted on trust, which
// the share would not see.
func (l *Limiter) remembered(key string) bool {
	if l.ledger.Empty() {
		return false
	}
	full, _ := l.ledger.Full(key, l.clock.Now())
	return full > 0
}

// left receives every entry that leaves the store (reconcile.Config.OnLeave),
// with the consumption it had not settled, and writes in the ledger when the
// key's local bucket under the fallback policy would be full again: what a
// new entry of the key, made during an outage, starts from (see seed). A
// key's bucket as it stands, if the fallback used it, and else the share it
// would have started from; the later of the two.
func (l *Limiter) left(e *reconcile.Entry, pending int64) {
	sp := e.X.Spec()
	if sp == nil || l.fb.kind == failOpen || l.fb.kind == failClosed {
		return // never used, or a policy with no buckets
	}
	if l.r.Closed() {
		return // Close drains the store: no decision reads the ledger again
	}
	share := l.shareOf(sp)
	now := l.clock.Now()
	s := l.seed(e, sp, share, now, pending)
	full := now + limit.DurationFor(share.Burst-s, share.Rate)
	if f, ok := e.Full(); ok {
		full = max(full, f)
	}
	l.ledger.Put(e.Key(), full, now)
}

// spent records cost micro-tokens admitted on e as its consumption, charged
// at the next round (e's Pending); if e left the store meanwhile, as an
// orphan.
func (l *Limiter) spent(e *reconcile.Entry, sp *reconcile.Spec, cost int64) {
	if !e.Pending.Add(cost) {
		l.orphan(e, sp, cost)
	}
}

// orphan records consumption of cost micro-tokens decided on e, which left
// the store meanwhile (its Pending refused it): charged at the next round,
// and written in the ledger, which e's leaving wrote before the decision
// took its tokens.
func (l *Limiter) orphan(e *reconcile.Entry, sp *reconcile.Spec, cost int64) {
	l.r.Orphan(e.Key(), sp, cost)
	l.left(e, cost)
}
