package hybrid_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
)

// statsSources are the sources of a decision, for loops.
var statsSources = []hybrid.Source{hybrid.SourceLocal, hybrid.SourceRedis, hybrid.SourceFallback}

// statsTally tallies decisions by outcome and source, as the Results say.
type statsTally struct {
	mu sync.Mutex
	n  [2][3]uint64 // [allowed][source]
}

func (b *statsTally) add(res hybrid.Result) {
	a := 0
	if res.Allowed {
		a = 1
	}
	b.mu.Lock()
	b.n[a][res.Source]++
	b.mu.Unlock()
}

// check compares st's counts by source with the Results tallied.
func (b *statsTally) check(t *testing.T, when string, st hybrid.Stats) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, src := range statsSources {
		if got, want := st.Allowed(src), b.n[1][src]; got != want {
			t.Errorf("%s: Stats.Allowed(%v) = %d, want %d (the Results that said so)", when, src, got, want)
		}
		if got, want := st.Denied(src), b.n[0][src]; got != want {
			t.Errorf("%s: Stats.Denied(%v) = %d, want %d", when, src, got, want)
		}
	}
}

// TestStatsBySource: every decision is counted once, under the source its
// Result names, whatever the entry point (Allow, Reserve, AllowAll), the mode
// and the path (hot or slow, local, Redis or fallback), with concurrent
// callers and an outage in the middle. The allowed decisions counted in the
// keys' entries are all summed one round after the traffic stops.
func TestStatsBySource(t *testing.T) {
	inFleet(t, 2, hybrid.Config{}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		limits := []hybrid.Limit{
			{Rate: 5, Burst: 20},
			{Rate: 5, Burst: 20, Mode: hybrid.Optimistic},
			{Rate: 5, Burst: 20, Mode: hybrid.Exact},
			{Rate: 2000, Burst: 1000}, // a hot key that mostly spends its lease
		}
		var tally statsTally
		var wg sync.WaitGroup
		end := time.Now().Add(3 * time.Second)
		for w := range 4 {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			wg.Go(func() {
				for time.Now().Before(end) {
					i := rng.IntN(len(limits))
					key := fmt.Sprintf("k%d-%d", i, rng.IntN(3))
					switch rng.IntN(4) {
					case 0:
						r, err := l.Reserve(ctx, key, limits[i], 1)
						if err != nil {
							t.Errorf("Reserve(%s) = %v", key, err)
							return
						}
						tally.add(r.Result())
						if rng.IntN(2) == 0 {
							r.Cancel() // still a decision allowed
						}
					case 1:
						j := rng.IntN(len(limits))
						d, err := l.AllowAll(ctx,
							hybrid.Check{Key: key, Limit: limits[i]},
							hybrid.Check{Key: fmt.Sprintf("k%d-%d", j, rng.IntN(3)), Limit: limits[j]})
						if err != nil {
							t.Errorf("AllowAll = %v", err)
							return
						}
						for _, res := range d.Results {
							tally.add(res)
						}
					default:
						res, err := l.Allow(ctx, key, limits[i])
						if err != nil {
							t.Errorf("Allow(%s) = %v", key, err)
							return
						}
						tally.add(res)
					}
					time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
				}
			})
		}
		time.Sleep(time.Second)
		f.setDown(true) // a second of outage: the fallback decides
		time.Sleep(time.Second)
		f.setDown(false)
		wg.Wait()
		settle(3 * time.Second) // the breaker closes and a round visits every key
		st := l.Stats()
		tally.check(t, "after the traffic", st)
		for _, src := range statsSources {
			if st.Allowed(src) == 0 || (src != hybrid.SourceFallback && st.Denied(src) == 0) {
				t.Errorf("Stats: Allowed(%v) = %d, Denied(%v) = %d: the test did not reach every path", src, st.Allowed(src), src, st.Denied(src))
			}
		}
		if st.Refunds == 0 || st.ExactAllowed == 0 || st.FallbackConsumed != st.FallbackAllowed*micro {
			t.Errorf("Stats: %d refunds, %d exact allowed, %d micro-tokens for %d fallback admissions; want some, some, one token each",
				st.Refunds, st.ExactAllowed, st.FallbackConsumed, st.FallbackAllowed)
		}
		f.close(t)
		tally.check(t, "after Close", l.Stats())
	})
}

// TestStatsOutage: through an outage, the Stats show the breaker's state and
// transitions, the consumption admitted by the fallback and not yet charged,
// the failed rounds, and then its settlement; the log has one line for the
// breaker opening and one for it closing, and a few for the failing rounds.
func TestStatsOutage(t *testing.T) {
	var out statsLog
	logger := slog.New(slog.NewTextHandler(&out, nil))
	lim := hybrid.Limit{Rate: slow, Burst: 10}
	inFleet(t, 1, hybrid.Config{Logger: logger}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		f.setDown(true)
		for i := range 4 {
			res, err := l.Allow(ctx, "o", lim)
			if err != nil || !res.Allowed || res.Source != hybrid.SourceFallback {
				t.Fatalf("Allow %d in the outage = %+v, %v, want allowed by the fallback", i, res, err)
			}
		}
		settle(25 * time.Second)
		st := l.Stats()
		c, h, o := breaker.Closed, breaker.HalfOpen, breaker.Open
		if !st.Degraded || st.Reconcile.Breaker != o && st.Reconcile.Breaker != h {
			t.Errorf("in the outage: Degraded %v, breaker %v, want true, open or half-open", st.Degraded, st.Reconcile.Breaker)
		}
		if st.FallbackAllowed != 4 || st.FallbackConsumed != 4*micro || st.Reconcile.Unsettled != 4*micro {
			t.Errorf("in the outage: FallbackAllowed %d, FallbackConsumed %d, Unsettled %d, want 4, %d, %d",
				st.FallbackAllowed, st.FallbackConsumed, st.Reconcile.Unsettled, 4*micro, 4*micro)
		}
		if st.Reconcile.RoundErrors < 200 || st.Reconcile.HeartbeatErrors < 20 || st.Reconcile.BreakerTransitions[c][o] != 1 {
			t.Errorf("in the outage: %d round errors, %d heartbeat errors, %d openings, want >= 200, >= 20, 1",
				st.Reconcile.RoundErrors, st.Reconcile.HeartbeatErrors, st.Reconcile.BreakerTransitions[c][o])
		}
		f.setDown(false)
		settle(3 * time.Second)
		st = l.Stats()
		if st.Degraded || st.Reconcile.Breaker != c || st.Reconcile.Unsettled != 0 {
			t.Errorf("after the outage: Degraded %v, breaker %v, Unsettled %d, want false, closed, 0", st.Degraded, st.Reconcile.Breaker, st.Reconcile.Unsettled)
		}
		bt := st.Reconcile.BreakerTransitions
		if bt[c][o] != 1 || bt[h][c] != 1 || bt[o][h] != bt[h][o]+1 || bt[o][c]+bt[c][h] != 0 {
			t.Errorf("BreakerTransitions = %v, want one opening, one closing, probes in between", bt)
		}
		wantTokens(t, f.m, "o", 6*micro, int64(slow*micro*30)+1)
	})
	tests := []struct {
		msg  string
		want int
	}{
		{`level=WARN msg="hybrid: Redis unreachable`, 1},
		{`level=WARN msg="hybrid: settlement round failed`, 1},
		{`level=WARN msg="hybrid: settlement rounds still failing" failed_rounds=`, 2},
		{`unsettled_tokens=4 `, 2},
		{`level=INFO msg="hybrid: settlement rounds succeed again"`, 1},
		{`level=INFO msg="hybrid: Redis reachable again`, 1},
		{`level=INFO msg="hybrid: closed"`, 1},
	}
	for _, tt := range tests {
		if got := out.count(tt.msg); got != tt.want {
			t.Errorf("%d lines with %q, want %d; the log:\n%s", got, tt.msg, tt.want, out.String())
		}
	}
}

// TestStatsEvictedPending: keys evicted with consumption still to charge
// are counted, become orphans until the next round, and their allowed
// decisions are counted. Each key is asked twice: its first request is
// admitted on trust, the second learns its bucket from Redis.
func TestStatsEvictedPending(t *testing.T) {
	const keys = 100
	lim := hybrid.Limit{Rate: slow, Burst: 5, Mode: hybrid.Optimistic}
	inFleet(t, 1, hybrid.Config{MaxKeys: 10}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		for i := range keys {
			for j, src := range []hybrid.Source{hybrid.SourceLocal, hybrid.SourceRedis} {
				res, err := l.Allow(context.Background(), fmt.Sprint("k", i), lim)
				if err != nil || !res.Allowed || res.Source != src {
					t.Fatalf("Allow(k%d) #%d = %+v, %v, want allowed from %v", i, j+1, res, err, src)
				}
			}
		}
		st := l.Stats().Reconcile
		if st.Evicted < keys-10 || st.EvictedPending != st.Evicted || st.Orphans != int(st.Evicted) {
			t.Errorf("before a round: %d evicted, %d with dues, %d orphans; want at least %d, all, all", st.Evicted, st.EvictedPending, st.Orphans, keys-10)
		}
		if l.Stats().LocalAllowed != keys {
			t.Errorf("before a round: LocalAllowed %d, want %d: the first requests, admitted on trust, counted at once", l.Stats().LocalAllowed, keys)
		}
		settle(interval)
		all := l.Stats()
		st = all.Reconcile
		if st.Orphans != 0 || st.Unsettled != 0 || all.LocalAllowed != keys {
			t.Errorf("after a round: %d orphans, Unsettled %d, LocalAllowed %d, want 0, 0, %d", st.Orphans, st.Unsettled, all.LocalAllowed, keys)
		}
	})
}

// statsSkewHook sets Redis TIME to the caller's clock plus offset before every
// command: a Redis whose clock is offset from this host's.
type statsSkewHook struct {
	m      *miniredis.Miniredis
	offset time.Duration
}

func (h statsSkewHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h statsSkewHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.m.SetTime(time.Now().Add(h.offset))
		return next(ctx, cmd)
	}
}

func (h statsSkewHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.m.SetTime(time.Now().Add(h.offset))
		return next(ctx, cmds)
	}
}

// TestStatsSkew: Redis's clock offset from this host's shows as the skew,
// measured on the first heartbeat and then on the rounds, and the round
// trips are timed (no time passes for them in the bubble).
func TestStatsSkew(t *testing.T) {
	for _, offset := range []time.Duration{0, 1500 * time.Millisecond, -250 * time.Millisecond, 36 * time.Hour} {
		t.Run(offset.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			synctest.Test(t, func(t *testing.T) {
				rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
				rdb.AddHook(statsSkewHook{m, offset})
				defer rdb.Close()
				l, err := hybrid.New(rdb, hybrid.Config{})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close(context.Background())
				synctest.Wait()
				st := l.Stats().Reconcile
				if st.ClockSamples != 1 || st.Skew != offset || st.RTT != 0 || st.Live != 1 {
					t.Errorf("after the first heartbeat: ClockSamples %d, Skew %v, RTT %v, Live %d, want 1, %v, 0, 1", st.ClockSamples, st.Skew, st.RTT, st.Live, offset)
				}
				time.Sleep(time.Millisecond)
				lim := hybrid.Limit{Rate: 100, Burst: 100, Mode: hybrid.Optimistic}
				for range 3 {
					if _, err := l.Allow(context.Background(), "k", lim); err != nil {
						t.Fatal(err)
					}
					settle(interval)
				}
				st = l.Stats().Reconcile
				// The heartbeats sample the clock too: the first few come
				// a round apart.
				if st.ClockSamples < 1+st.RoundTrip.Count || st.RoundTrip.Count != 3 || st.Skew != offset {
					t.Errorf("after 3 rounds: ClockSamples %d, RoundTrip.Count %d, Skew %v, want at least 4, 3, %v", st.ClockSamples, st.RoundTrip.Count, st.Skew, offset)
				}
			})
		})
	}
}

// statsLog collects log output; it is safe for concurrent use.
type statsLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *statsLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *statsLog) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// count returns the lines that contain s.
func (b *statsLog) count(s string) int {
	n := 0
	for line := range strings.Lines(b.String()) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestStatsExactResets: an Exact call that finds another type under its key
// replaces it with a full bucket, decides on it and counts the reset.
func TestStatsExactResets(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		lim := hybrid.Limit{Rate: slow, Burst: 3, Mode: hybrid.Exact}
		if err := f.m.Set("hybrid:{k}", "not a bucket"); err != nil {
			t.Fatal(err)
		}
		res, err := l.Allow(t.Context(), "k", lim)
		if err != nil || !res.Allowed || res.Source != hybrid.SourceRedis {
			t.Fatalf("Allow over a string = %+v, %v; want allowed by Redis", res, err)
		}
		if st := l.Stats(); st.ExactResets != 1 || st.ExactErrors != 0 {
			t.Errorf("ExactResets = %d, ExactErrors = %d; want 1, 0", st.ExactResets, st.ExactErrors)
		}
		res, err = l.Allow(t.Context(), "k", lim)
		if err != nil || !res.Allowed || l.Stats().ExactResets != 1 {
			t.Errorf("second Allow = %+v, %v, ExactResets %d; want allowed, still 1 reset", res, err, l.Stats().ExactResets)
		}
		wantTokens(t, f.m, "k", 1*micro, 1000)
	})
}
