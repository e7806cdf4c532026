package windows

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// newClient returns a client of addr with a pool of size connections,
// which the caller closes.
func newClient(addr string, size int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		Dialer:                   redistest.LoopbackDialer(5 * time.Second),
		PoolSize:                 size,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// ownServer returns a redis-server of the test's own (it flushes the server
// and resets its statistics), or skips the test on a shared one.
func ownServer(t *testing.T) *redistest.Proc {
	t.Helper()
	p := redistest.Server(t)
	if !p.Owned() {
		t.Skipf("needs a redis-server of its own (it flushes it and resets its statistics), not %s from %s", p.Addr(), redistest.EnvAddr)
	}
	return p
}

// costRow is what a limiter cost Redis for a run of many keys.
type costRow struct {
	name      string
	allowed   int64
	errors    int64
	elapsed   time.Duration
	cost      cost
	keys      int64   // DBSIZE growth
	memPerKey float64 // used_memory growth over keys
	usage     float64 // mean MEMORY USAGE of the keys
}

// TestRedisCost measures, on one redis-server, what each limiter costs
// Redis in memory per key and in commands and CPU per decision: one
// instance of 16 workers asks each of many keys 10 times, in a shuffled
// order, at a limit of 10 a minute (the token buckets: 10/min, burst 10),
// so that every request is allowed and every key ends its run full, its
// log holding 10 entries. Between limiters the server is flushed; the
// commands and CPU run from just before the first ask to the end of the
// last (a hybrid Limiter's Close included), the memory and keys from
// before the limiter's client connected to after it disconnected.
//
// It runs 300 keys; HYBRID_WINDOWS=full runs the 10,000 that
// docs/windows.md quotes:
//
//	HYBRID_WINDOWS=full go test -run TestRedisCost -v ./bench/internal/windows
func TestRedisCost(t *testing.T) {
	p := ownServer(t)
	ctx := context.Background()
	nkeys, asks, workers := 300, 10, 16
	if full() {
		nkeys = 10000
	}
	s := spec{Count: 10, Window: time.Minute, Burst: 10}
	keys, order := shuffledAsks(nkeys, asks)
	m := meter{rdb: redistest.Client(t, p)}
	var rows []costRow
	for _, c := range contenders {
		row, err := runCost(ctx, p.Addr(), m, c, s, keys, order, workers)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rows = append(rows, row)
	}
	t.Logf("\n%d keys x %d asks, 1 instance x %d workers, limit %d per %v (token buckets: burst %d); redis-server %s\n%s",
		nkeys, asks, workers, s.Count, s.Window, s.Burst, p.Addr(), costTable(rows))

	byName := make(map[string]costRow)
	for _, r := range rows {
		byName[r.name] = r
		if r.errors > 0 {
			t.Errorf("%s: %d errors", r.name, r.errors)
		}
	}
	for _, name := range []string{"fixed window", "sliding log", "sliding counter", "GCRA (redis_rate)"} {
		if r := byName[name]; r.allowed != int64(len(order)) {
			t.Errorf("%s allowed %d of %d, want all (10 per key, the limit)", name, r.allowed, len(order))
		}
	}
	if log, fixed := byName["sliding log"], byName["fixed window"]; log.usage <= fixed.usage {
		t.Errorf("MEMORY USAGE: sliding log %.0f B a key, fixed window %.0f B: want the log larger", log.usage, fixed.usage)
	}
}

// shuffledAsks returns n keys, "user0" to "user<n-1>", and the order in
// which they are asked: each asks times, shuffled (the same every run).
func shuffledAsks(n, asks int) ([]string, []int32) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user%d", i)
	}
	order := make([]int32, 0, n*asks)
	for range asks {
		for i := range n {
			order = append(order, int32(i))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	return keys, order
}

// runCost runs the many-keys load through c on a flushed server.
func runCost(ctx context.Context, addr string, m meter, c contender, s spec, keys []string, order []int32, workers int) (costRow, error) {
	// A first decision, on a limiter of its own, loads the scripts, so that
	// the script cache does not count as the keys' memory.
	warm := newClient(addr, 1)
	defer warm.Close()
	wp, err := c.peer(warm, s, 1, 1)
	if err != nil {
		return costRow{}, err
	}
	if _, _, err := wp.allow(ctx, "warmup"); err != nil {
		return costRow{}, err
	}
	if err := wp.close(ctx); err != nil {
		return costRow{}, err
	}
	if err := warm.Close(); err != nil {
		return costRow{}, err
	}
	if err := m.flush(ctx); err != nil {
		return costRow{}, err
	}
	empty, err := m.read(ctx, true)
	if err != nil {
		return costRow{}, err
	}
	rdb := newClient(addr, workers)
	defer rdb.Close()
	pr, err := c.peer(rdb, s, 0, 1)
	if err != nil {
		return costRow{}, err
	}
	from, err := m.read(ctx, true)
	if err != nil {
		return costRow{}, err
	}
	row := costRow{name: c.name}
	var next, allowed, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(order)) {
					return
				}
				switch ok, _, err := pr.allow(ctx, keys[order[i]]); {
				case err != nil:
					errs.Add(1)
				case ok:
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err := pr.close(ctx); err != nil {
		return costRow{}, err
	}
	row.elapsed = time.Since(start)
	row.allowed, row.errors = allowed.Load(), errs.Load()
	if err := rdb.Close(); err != nil {
		return costRow{}, err
	}
	if err := m.waitClients(ctx, empty.clients); err != nil {
		return costRow{}, err
	}
	to, err := m.read(ctx, true)
	if err != nil {
		return costRow{}, err
	}
	row.cost = costOf(from, to, c.top, int64(len(order)))
	row.keys = to.keys - empty.keys
	if row.keys > 0 {
		row.memPerKey = float64(to.usedMemory-empty.usedMemory) / float64(row.keys)
	}
	if row.usage, err = m.memoryUsage(ctx, "*user*", 100); err != nil {
		return costRow{}, err
	}
	return row, nil
}

// costTable formats the rows, then the commands Redis ran per decision,
// by name.
func costTable(rows []costRow) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "limiter\tdec/s\tallowed\tsent/dec\tredis cmd/dec\tusec_per_call\tredis µs/dec\tcpu µs/dec\tkeys\tused_memory/key\tMEMORY USAGE\t")
	for _, r := range rows {
		c := r.cost
		fmt.Fprintf(w, "%s\t%.0f\t%.1f%%\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%.0f B\t%.0f B\t\n",
			r.name, float64(c.decisions)/r.elapsed.Seconds(), 100*c.per(r.allowed), c.per(c.sent), c.per(c.calls),
			c.usecPerCall(), c.per(c.usec), float64(c.cpu.Microseconds())/float64(max(c.decisions, 1)),
			r.keys, r.memPerKey, r.usage)
	}
	w.Flush()
	b.WriteString("\nRedis commands per decision, by name (those of scripts and MULTI included):\n")
	for _, r := range rows {
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(r.cost.byName)) {
			parts = append(parts, fmt.Sprintf("%s %.3f", name, r.cost.per(r.cost.byName[name].calls)))
		}
		fmt.Fprintf(&b, "  %-20s %s\n", r.name, strings.Join(parts, ", "))
	}
	return b.String()
}
