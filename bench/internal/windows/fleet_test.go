package windows

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// fleetRun is the shape of TestFleet's runs.
type fleetRun struct {
	spec
	instances, workers int
	lead               time.Duration // the flood starts this long before a window boundary
	span               time.Duration // and lasts this long
}

// fleetRow is what a fleet admitted, and what it cost Redis.
type fleetRow struct {
	name      string
	decisions int64
	errors    int64
	times     []time.Time // of the admissions, sorted
	elapsed   time.Duration
	cost      cost
}

// admitted returns the admissions.
func (r fleetRow) admitted() int { return len(r.times) }

// mostIn returns the most admissions in any interval [s, s+d).
func (r fleetRow) mostIn(d time.Duration) int {
	ds := make([]time.Duration, len(r.times))
	for i, t := range r.times {
		ds[i] = t.Sub(r.times[0])
	}
	return most(ds, d)
}

// mostInWindow returns the most admissions in one fixed window of length
// w, aligned on the Unix epoch.
func (r fleetRow) mostInWindow(w time.Duration) int {
	per := make(map[int64]int)
	best := 0
	for _, t := range r.times {
		k := t.UnixMilli() / w.Milliseconds()
		per[k]++
		best = max(best, per[k])
	}
	return best
}

// TestFleet runs a fleet of instances, each with its own client (and, for
// hybrid, its own Limiter), whose workers all ask for one key as fast as
// they are answered, from shortly before a window boundary, for each
// limiter on one redis-server: what each admits, how it bunches around
// the boundary, whether it holds its own limit under contention, and what
// the contention costs Redis. Admissions are timed by the clock each
// algorithm decides by (Redis TIME for the window scripts, the caller's
// for the others), both this machine's.
//
// It runs small; HYBRID_WINDOWS=full runs 4 instances x 4 workers at 1000
// a second (the token buckets: burst 1000), from 50 ms before a boundary
// for 2 s, as docs/windows.md quotes:
//
//	HYBRID_WINDOWS=full go test -run TestFleet -v ./bench/internal/windows
func TestFleet(t *testing.T) {
	p := ownServer(t)
	ctx := context.Background()
	fr := fleetRun{
		spec:      spec{Count: 50, Window: 100 * time.Millisecond, Burst: 50},
		instances: 4, workers: 2,
		lead: 15 * time.Millisecond, span: 250 * time.Millisecond,
	}
	if full() {
		fr.spec = spec{Count: 1000, Window: time.Second, Burst: 1000}
		fr.workers, fr.lead, fr.span = 4, 50*time.Millisecond, 2*time.Second
	}
	m := meter{rdb: redistest.Client(t, p)}
	var rows []fleetRow
	for _, c := range contenders {
		row, err := runFleet(ctx, p.Addr(), m, c, fr)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rows = append(rows, row)
	}
	t.Logf("\n%d instances x %d workers, one key, limit %d per %v (token buckets: burst %d), from %v before a boundary for %v; redis-server %s\n%s",
		fr.instances, fr.workers, fr.Count, fr.Window, fr.Burst, fr.lead, fr.span, p.Addr(), fleetTable(rows, fr))

	for _, r := range rows {
		if r.errors > 0 {
			t.Errorf("%s: %d errors", r.name, r.errors)
		}
		switch r.name {
		case "fixed window":
			if n := r.mostInWindow(fr.Window); n > int(fr.Count) {
				t.Errorf("%s: %d admitted in one window, want at most %d", r.name, n, fr.Count)
			}
		case "sliding log":
			if n := r.mostIn(fr.Window); n > int(fr.Count) {
				t.Errorf("%s: %d admitted in %v, want at most %d", r.name, n, fr.Window, fr.Count)
			}
		case "GCRA (redis_rate)", "token bucket exact", "token bucket lease":
			if n, ideal := r.admitted(), fr.ideal(r.elapsed); float64(n) > ideal {
				t.Errorf("%s: admitted %d in %v, want at most B + R*T = %.1f", r.name, n, r.elapsed, ideal)
			}
		}
	}
}

// ideal returns B + R*t, what a token bucket admits at most in t.
func (fr fleetRun) ideal(t time.Duration) float64 {
	return float64(fr.Burst) + fr.rate()*t.Seconds()
}

// runFleet floods one key through a fleet of c on a flushed server.
func runFleet(ctx context.Context, addr string, m meter, c contender, fr fleetRun) (fleetRow, error) {
	if err := m.flush(ctx); err != nil {
		return fleetRow{}, err
	}
	peers := make([]peer, fr.instances)
	for i := range peers {
		rdb := newClient(addr, fr.workers)
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fleetRow{}, err
		}
		pr, err := c.peer(rdb, fr.spec, i, fr.instances)
		if err != nil {
			return fleetRow{}, err
		}
		defer pr.close(ctx)
		peers[i] = pr
	}
	from, err := m.read(ctx, true)
	if err != nil {
		return fleetRow{}, err
	}
	// Start lead before the next window boundary that is far enough.
	w := fr.Window.Milliseconds()
	b := (time.Now().UnixMilli()/w + 1) * w
	start := time.UnixMilli(b).Add(-fr.lead)
	if time.Until(start) < 10*time.Millisecond {
		start = start.Add(fr.Window)
	}
	end := start.Add(fr.span)
	timer := time.NewTimer(time.Until(start))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return fleetRow{}, ctx.Err()
	case <-timer.C:
	}

	type tally struct {
		decisions, errors int64
		times             []time.Time
	}
	tallies := make([]tally, fr.instances*fr.workers)
	var wg sync.WaitGroup
	for i := range tallies {
		pr := peers[i/fr.workers]
		tl := &tallies[i]
		wg.Go(func() {
			for time.Now().Before(end) {
				ok, at, err := pr.allow(ctx, "fleet")
				tl.decisions++
				switch {
				case err != nil:
					tl.errors++
				case ok:
					tl.times = append(tl.times, at)
				}
				if tl.decisions%64 == 0 {
					runtime.Gosched() // as a handler does at its I/O
				}
			}
		})
	}
	wg.Wait()
	row := fleetRow{name: c.name, elapsed: time.Since(start)}
	to, err := m.read(ctx, false)
	if err != nil {
		return fleetRow{}, err
	}
	for _, tl := range tallies {
		row.decisions += tl.decisions
		row.errors += tl.errors
		row.times = append(row.times, tl.times...)
	}
	slices.SortFunc(row.times, time.Time.Compare)
	row.cost = costOf(from, to, c.top, row.decisions)
	return row, nil
}

// fleetTable formats the rows.
func fleetTable(rows []fleetRow, fr fleetRun) string {
	var b strings.Builder
	near := 2 * fr.lead
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "limiter\tdec/s\tadmitted\tmost in %v\tmost in %v\tmost in a window\tover its limit\tsent/dec\tredis cmd/dec\tcpu µs/dec\t\n", fr.Window, near)
	for _, r := range rows {
		over := "-"
		switch r.name {
		case "fixed window", "fixed, GET+INCR":
			over = fmt.Sprintf("%+d", r.mostInWindow(fr.Window)-int(fr.Count))
		case "sliding log":
			over = fmt.Sprintf("%+d", r.mostIn(fr.Window)-int(fr.Count))
		case "GCRA (redis_rate)", "token bucket exact", "token bucket lease":
			over = fmt.Sprintf("%+.0f", float64(r.admitted())-fr.ideal(r.elapsed))
		}
		c := r.cost
		fmt.Fprintf(w, "%s\t%.0f\t%d\t%d\t%d\t%d\t%s\t%.4f\t%.4f\t%.2f\t\n",
			r.name, float64(r.decisions)/r.elapsed.Seconds(), r.admitted(), r.mostIn(fr.Window), r.mostIn(near),
			r.mostInWindow(fr.Window), over, c.per(c.sent), c.per(c.calls), float64(c.cpu.Microseconds())/float64(max(c.decisions, 1)))
	}
	w.Flush()
	return b.String()
}
