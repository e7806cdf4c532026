package windows

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// memLimits are the limits per minute at which TestRedisMemory measures.
var memLimits = []int64{10, 100, 1000}

// TestRedisMemory measures the memory a key takes in Redis at limits of
// 10, 100 and 1000 a minute (the token buckets: that rate, and a burst of
// the limit), each key asked as many times as its limit: every request is
// allowed, and every key ends full, its log holding one entry a request.
// The keys are as many as make 1,000 asks in all at each limit, one
// instance of 16 workers asking them in a shuffled order, on one
// redis-server flushed between runs. The figure is MEMORY USAGE (SAMPLES
// 0), the mean over up to 100 keys: used_memory over so few keys as the
// highest limit has is mostly the server's own noise (TestRedisCost reads
// it over 10,000 keys). HYBRID_WINDOWS=full makes 100,000 asks at each limit (10,000,
// 1,000 and 100 keys), as docs/windows.md quotes:
//
//	HYBRID_WINDOWS=full go test -run TestRedisMemory -v ./bench/internal/windows
func TestRedisMemory(t *testing.T) {
	p := ownServer(t)
	ctx := context.Background()
	total := 1000
	if full() {
		total = 100000
	}
	m := meter{rdb: redistest.Client(t, p)}
	rows := make([][]costRow, len(contenders)) // by contender, by limit
	for _, l := range memLimits {
		keys, order := shuffledAsks(total/int(l), int(l))
		s := spec{Count: l, Window: time.Minute, Burst: l}
		for i, c := range contenders {
			row, err := runCost(ctx, p.Addr(), m, c, s, keys, order, 16)
			if err != nil {
				t.Fatalf("%s at %d/min: %v", c.name, l, err)
			}
			if row.errors > 0 {
				t.Errorf("%s at %d/min: %d errors", c.name, l, row.errors)
			}
			rows[i] = append(rows[i], row)
		}
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(w, "limiter\t")
	for _, l := range memLimits {
		fmt.Fprintf(w, "%d/min: MEMORY USAGE\tallowed\t", l)
	}
	fmt.Fprintln(w)
	for i, c := range contenders {
		fmt.Fprintf(w, "%s\t", c.name)
		for _, r := range rows[i] {
			fmt.Fprintf(w, "%.0f B\t%.1f%%\t", r.usage, 100*r.cost.per(r.allowed))
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	t.Logf("\n%d asks at each limit, each key asked its limit's count, 1 instance x 16 workers; redis-server %s\n%s", total, p.Addr(), b.String())

	// The log holds an entry per request in its window; the others hold
	// a count or two, or a bucket.
	for i, c := range contenders {
		r := rows[i]
		if c.name == "sliding log" {
			if !(r[0].usage < r[1].usage && r[1].usage < r[2].usage) {
				t.Errorf("sliding log: MEMORY USAGE %.0f, %.0f, %.0f B a key at %v a minute: want it to grow", r[0].usage, r[1].usage, r[2].usage, memLimits)
			}
			continue
		}
		if r[2].usage > 2*r[0].usage {
			t.Errorf("%s: MEMORY USAGE %.0f B a key at %d a minute, %.0f B at %d: want it about the same", c.name, r[2].usage, memLimits[2], r[0].usage, memLimits[0])
		}
	}
}
