package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestBatchIsolation: requests that need Redis at once go together, and
// each gets its own outcome. 200 exact decisions for keys of their own from
// 40 goroutines, on a real redis-server and on a 3-master Cluster, among
// them a key Redis holds as a string (the script replaces it: allowed, a
// reset), a key too long (its caller alone gets the error) and callers
// whose context is done already (they alone get its error, and nothing is
// sent for them; TestBatch in reconcile has a caller that gives up while
// its batch is on its way). Every other key is charged exactly its one
// token.
func TestBatchIsolation(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		p := redistest.Server(t)
		batchIsolation(t, redistest.Client(t, p))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		batchIsolation(t, redistest.ClusterClient(t, c))
	})
}

func batchIsolation(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	// Outcomes, not timing: a call that outlived the default 50ms (a
	// Cluster node's first, its script loaded, under the race detector on
	// a busy machine) would deny its batch's keys as unanswered while the
	// script ran, which is right for a slow Redis and not what this tests.
	l, err := hybrid.New(rdb, hybrid.Config{
		Prefix:   "iso",
		ColdWait: 10 * time.Second,
		Breaker:  breaker.Config{CallTimeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	lim := hybrid.Limit{Rate: 1e-3, Burst: 5, Mode: hybrid.Exact}
	const keys = 200
	name := func(i int) string { return fmt.Sprint("k", i) }
	const wrong, long, gone = 17, 42, 7 // gone: every 7th key's caller gave up
	if err := rdb.Set(ctx, "iso:{"+name(wrong)+"}", "not a bucket", 0).Err(); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	type outcome struct {
		res hybrid.Result
		err error
	}
	out := make([]outcome, keys)
	var wg sync.WaitGroup
	for w := range 40 {
		wg.Go(func() {
			for i := w; i < keys; i += 40 {
				key, c := name(i), ctx
				if i == long {
					key = strings.Repeat("x", 1<<20)
				}
				if i%gone == 0 {
					c = done
				}
				out[i].res, out[i].err = l.Allow(c, key, lim)
			}
		})
	}
	wg.Wait()
	for i, o := range out {
		switch {
		case i == long:
			if o.err == nil || o.res.Allowed {
				t.Errorf("the key too long: %+v, %v; want an error of its own", o.res, o.err)
			}
		case i%gone == 0:
			if !errors.Is(o.err, context.Canceled) {
				t.Errorf("key %d, its caller gone: %+v, %v; want %v", i, o.res, o.err, context.Canceled)
			}
			if n, err := rdb.Exists(ctx, "iso:{"+name(i)+"}").Result(); err != nil || n != 0 {
				t.Errorf("key %d, its caller gone before: in Redis (%d, %v), want nothing sent", i, n, err)
			}
		default:
			if o.err != nil || !o.res.Allowed || o.res.Source != hybrid.SourceRedis || o.res.Remaining != 4 {
				t.Errorf("key %d: %+v, %v; want allowed by Redis, 4 left", i, o.res, o.err)
			}
			h, err := redistest.BucketTokens(ctx, rdb, "iso:{"+name(i)+"}")
			if err != nil || h < 4_000_000 || h > 4_000_000+100 {
				t.Errorf("key %d: its bucket holds %d, %v; want 4 tokens (and a trace of refill)", i, h, err)
			}
		}
	}
	st := l.Stats()
	if st.ExactResets != 1 {
		t.Errorf("ExactResets = %d, want 1: the string replaced", st.ExactResets)
	}
	if st.Reconcile.Batches == 0 || st.Reconcile.Batched < st.Reconcile.Batches {
		t.Errorf("Stats: %d batches of %d settlements", st.Reconcile.Batches, st.Reconcile.Batched)
	}
	t.Logf("%d decisions in %d batches", st.Reconcile.Batched, st.Reconcile.Batches)
}
