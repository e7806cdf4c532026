package hybrid

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
	"github.com/redis/go-redis/v9"
)

// New returns a Limiter that keeps its global buckets in rdb (a standalone
// Redis, Sentinel or Redis Cluster client) and starts its reconciler. The
// client the service uses already will do: a settlement its own retries
// send again is applied once, or, for a decision, errs towards denying. It
// should have ContextTimeoutEnabled, so that the limiter's call deadlines
// reach the socket; New logs one warning on cfg.Logger when a client whose
// options it can read does not.
func New(rdb redis.UniversalClient, cfg Config) (*Limiter, error) {
	g, err := global.New(rdb, global.Config{Prefix: cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	if err := cfg.Fallback.check(); err != nil {
		return nil, err
	}
	checkClient(rdb, cfg.Logger)
	size := ledgerSize(cfg.MaxKeys)
	l := &Limiter{g: g, fb: cfg.Fallback, ledger: local.NewLedger(size), maxOrphans: size}
	r, err := reconcile.New(g, reconcile.Config{
		SyncInterval:  cfg.SyncInterval,
		FirstRound:    cmp.Or(cfg.FirstRound, firstRound(cmp.Or(cfg.SyncInterval, reconcile.DefaultSyncInterval))),
		LocalCapacity: cfg.LocalCapacity,
		MaxKeys:       cfg.MaxKeys,
		ColdWait:      cfg.ColdWait,
		MaxDebt:       cfg.MaxDebt,
		RefillPace:    cfg.RefillPace,
		ShareCredit:   cfg.Fallback.kind == localShare,
		Instances:     cfg.Instances,
		InstanceID:    cfg.InstanceID,
		Breaker:       cfg.Breaker,
		Logger:        cfg.Logger,
		OnLeave:       func(e *reconcile.Entry, pending int64) { l.left(e, pending) },
		Ledger:        l.ledger,
	})
	if err != nil {
		return nil, fmt.Errorf("hybrid: %w", err)
	}
	l.r, l.keys, l.clock = r, r.Keys(), r.Clock()
	// A dial the network refuses tells the node's breaker at once that
	// Redis is gone, not slow (docs/failure.md).
	l.unwatch = global.WatchDials(rdb, r.Gone)
	return l, nil
}

// firstRound draws when a new Limiter's first settlement round comes when
// Config.FirstRound is 0: at random within the sync interval si, so that a
// fleet started at once settles at as many moments as it has instances.
var firstRound = func(si time.Duration) time.Duration {
	if si <= 0 {
		return 0 // an invalid interval, which New reports
	}
	return 1 + time.Duration(rand.Int64N(int64(si)))
}

// Close stops the reconciler, waits for it, and settles every key for the
// last time within ctx: leases go back, consumption is charged. Decisions
// after Close return ErrClosed. Close is idempotent.
func (l *Limiter) Close(ctx context.Context) error {
	err := l.r.Close(ctx)
	l.unwatch()
	if err != nil {
		return fmt.Errorf("hybrid: %w", err)
	}
	return nil
}
