package hybrid_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The fault tests cut the links between the instances and Redis, or change
// Redis behind their back, in a synctest bubble: an outage lasts exactly as
// long as the test says, and the breaker's timeouts run on the same clock.

// openTimeout is how long the breaker stays open before it probes, by
// default.
const openTimeout = breaker.DefaultOpenTimeout

// window counts one instance's decisions over a stretch of time.
type window struct {
	allowed, denied int64
	bySource        [3]int64
}

// add counts res.
func (w *window) add(res hybrid.Result) {
	if res.Allowed {
		w.allowed++
		w.bySource[res.Source]++
	} else {
		w.denied++
	}
}

// each makes every instance of f ask for key under lim once every gap, in
// turn, for d, and returns each instance's decisions. after, if not nil, is
// called after every turn with the turn's number. A decision that fails
// fails the test.
func each(t *testing.T, f *fleet, key string, lim hybrid.Limit, gap, d time.Duration, after func(turn int)) []window {
	t.Helper()
	ws := make([]window, len(f.lims))
	for turn := 0; time.Duration(turn)*gap < d; turn++ {
		for i, l := range f.lims {
			res, err := l.Allow(context.Background(), key, lim)
			if err != nil {
				t.Fatalf("instance %d, turn %d: Allow(%s) = %v, want no error", i, turn, key, err)
			}
			ws[i].add(res)
		}
		if after != nil {
			after(turn)
		}
		time.Sleep(gap)
	}
	return ws
}

// TestOutageLocalShare: 4 instances share R=100/s B=100 on a hot key when
// every link to Redis is cut. Every decision still answers, without error;
// the breakers trip after three failed calls and each instance then admits
// its share, B/N + R/N*T over the outage. When the links are back, the
// breakers close within two open timeouts and a round, the outage's
// consumption is charged to Redis with the refill the shares kept claimed
// back (the bucket holds what it would had it seen every admission), and
// decisions are made with Redis again.
func TestOutageLocalShare(t *testing.T) {
	const (
		n      = 4
		rate   = 100
		burst  = 100
		gap    = 10 * time.Millisecond // each instance asks for 100/s, 4x its share
		outage = 2 * time.Second
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst}
	inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
		settle(time.Second) // heartbeats: every instance counts the fleet
		for i, l := range f.lims {
			if got := l.Stats().Reconcile.Instances; got != n {
				t.Fatalf("instance %d counts %d instances, want %d", i, got, n)
			}
		}
		each(t, f, "hot", lim, gap, time.Second, nil)
		// Idle: the leases go back and the bucket fills up again, so that
		// the instances hold nothing when the links are cut.
		settle(1500 * time.Millisecond)

		f.setDown(true)
		start := time.Now()
		out := each(t, f, "hot", lim, gap, outage, func(turn int) {
			// Each turn's fetch fails, as do the rounds: after three
			// turns the breakers are open.
			if turn < 2 {
				return
			}
			for i, l := range f.lims {
				if st := l.Stats(); !st.Degraded || st.Reconcile.Breaker == breaker.Closed {
					t.Fatalf("turn %d of the outage: instance %d: Degraded %v, breaker %v, want degraded", turn, i, st.Degraded, st.Reconcile.Breaker)
				}
			}
		})
		elapsed := time.Since(start)
		share := float64(burst)/n + float64(rate)/n*elapsed.Seconds()
		var admitted int64
		for i, w := range out {
			t.Logf("outage of %v: instance %d admitted %d (%d from fallback), denied %d; share %.1f", elapsed, i, w.allowed, w.bySource[hybrid.SourceFallback], w.denied, share)
			if float64(w.allowed) > share {
				t.Errorf("instance %d admitted %d during the outage, more than its share %.1f", i, w.allowed, share)
			}
			if float64(w.allowed) < share-2 {
				t.Errorf("instance %d admitted %d during the outage, want its share %.1f", i, w.allowed, share)
			}
			if w.bySource[hybrid.SourceFallback] != w.allowed {
				t.Errorf("instance %d: %d of %d admitted from fallback, want all: it held nothing when the links were cut", i, w.bySource[hybrid.SourceFallback], w.allowed)
			}
			admitted += w.allowed
		}

		// Links back: within two open timeouts and a round, every breaker
		// closes; its probe settles the outage's consumption.
		f.setDown(false)
		deadline := 2*openTimeout + interval
		back := time.Now()
		for {
			degraded := 0
			for _, l := range f.lims {
				if l.Stats().Degraded {
					degraded++
				}
			}
			if degraded == 0 {
				break
			}
			if time.Since(back) > deadline {
				t.Fatalf("%d instances still degraded %v after the links came back, want none after %v", degraded, time.Since(back), deadline)
			}
			settle(interval / 10)
		}
		settle(interval)
		for i, l := range f.lims {
			st := l.Stats()
			if st.Degraded || st.Reconcile.Breaker != breaker.Closed || st.Reconcile.Orphans != 0 {
				t.Errorf("instance %d after recovery: Degraded %v, breaker %v, %d orphans, want closed and settled", i, st.Degraded, st.Reconcile.Breaker, st.Reconcile.Orphans)
			}
		}
		// The bucket was full when the links were cut, and the fleet
		// admitted its shares, B + R*T, meanwhile. Charged in full against a
		// bucket that, full, lost the outage's refill, they would sink it to
		// -B and below; the shares claim back the refill they kept, so the
		// bucket holds what it would had it seen the admissions as they
		// came: B, plus the refill since the shares began, less what they
		// admitted. Not in debt, and no more than B + R*T - admitted.
		got := tokensIn(t, f.m, "hot")
		hi := (burst + rate*time.Since(start).Seconds() - float64(admitted)) * micro
		t.Logf("the fleet admitted %d during the outage; Redis bucket after recovery: %d micro-tokens, at most %.0f", admitted, got, hi)
		if got < 0 || float64(got) > hi {
			t.Errorf("Redis bucket holds %d micro-tokens after the outage's charges, want within [0, %.0f]", got, hi)
		}

		// Decisions are made with Redis again.
		for i, l := range f.lims {
			res, err := l.Allow(context.Background(), "hot", lim)
			if err != nil || res.Source == hybrid.SourceFallback {
				t.Errorf("instance %d after recovery: Allow = %+v, %v, want decided with Redis, not by fallback", i, res, err)
			}
		}
	})
}

// TestOutageMidRun: 4 instances ask for a key of R=100/s B=100 at 4x its
// limit when every link to Redis is cut, mid-run: the fallback's shares
// start from what each instance last saw the bucket hold (nearly nothing:
// the key is saturated), not from a fresh B/N each, so over the whole run
// the fleet admits B + R*T, not a burst more (it admitted 595 of 500 when
// each share started full).
//
// Then two outages a moment apart (a master killed, and the replica
// promoted in its place killed soon after): the second outage's shares
// start again from what each instance last saw, not from where the first
// outage's left off, however lately those were used (the fallback decides
// a few rounds after the breakers close): they refilled while the fleet
// spent through Redis between the outages.
func TestOutageMidRun(t *testing.T) {
	const (
		n     = 4
		rate  = 100
		burst = 100
		gap   = 10 * time.Millisecond // each instance asks for 100/s, 4x its share
	)
	// An outage of down, then up once every breaker closed again.
	type outage struct{ down, up time.Duration }
	for _, c := range []struct {
		name    string
		outages []outage
	}{
		{"one", []outage{{2 * time.Second, 0}}},
		{"two a moment apart", []outage{{time.Second, 500 * time.Millisecond}, {time.Second, 2 * time.Second}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lim := hybrid.Limit{Rate: rate, Burst: burst}
			inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
				settle(time.Second) // heartbeats: every instance counts the fleet
				start := time.Now()
				var admitted, fallback int64
				run := func(d time.Duration) {
					for _, w := range each(t, f, "hot", lim, gap, d, nil) {
						admitted += w.allowed
						fallback += w.bySource[hybrid.SourceFallback]
					}
				}
				run(2 * time.Second)
				for _, o := range c.outages {
					f.setDown(true)
					run(o.down)
					f.setDown(false)
					if o.up == 0 {
						break
					}
					for slices.ContainsFunc(f.lims, func(l *hybrid.Limiter) bool { return l.Stats().Degraded }) {
						run(interval)
					}
					run(o.up)
				}
				elapsed := time.Since(start)
				bound := burst + rate*elapsed.Seconds()
				t.Logf("admitted %d over %v (%d by the fallback), B + R*T %.0f", admitted, elapsed, fallback, bound)
				if float64(admitted) > bound {
					t.Errorf("admitted %d over %v, above B + R*T %.0f", admitted, elapsed, bound)
				}
				if float64(admitted) < 0.9*bound || fallback < rate {
					t.Errorf("admitted %d over %v (%d by the fallback), want about B + R*T %.0f, a second's rate or more by the fallback", admitted, elapsed, fallback, bound)
				}
			})
		})
	}
}

// TestOutagePolicies: each fallback policy over the same outage: one
// instance asks for a key limited to R=10/s B=10 every 10ms for 1s with its
// link cut. What the policy admitted is charged once Redis is back.
func TestOutagePolicies(t *testing.T) {
	lim := hybrid.Limit{Rate: 10, Burst: 10}
	tests := []struct {
		fb   hybrid.Fallback
		want int64 // admitted over the 100 decisions
	}{
		{hybrid.FailOpen, 100},
		{hybrid.FailClosed, 0},
		// The local bucket starts full and refills 0.2 tokens a decision:
		// floor(5 + 20*0.99).
		{hybrid.Static(hybrid.Limit{Rate: 20, Burst: 5}), 24},
		// One instance: its share is the whole limit, floor(10 + 10*0.99).
		{hybrid.LocalShare, 19},
	}
	for _, tt := range tests {
		t.Run(tt.fb.String(), func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{Instances: 1, Fallback: tt.fb}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				f.setDown(true)
				w := each(t, f, "k", lim, 10*time.Millisecond, time.Second, nil)[0]
				if w.allowed != tt.want || w.allowed+w.denied != 100 {
					t.Errorf("%v: %d of %d admitted during the outage, want %d of 100", tt.fb, w.allowed, w.allowed+w.denied, tt.want)
				}
				if w.bySource[hybrid.SourceFallback] != w.allowed {
					t.Errorf("%v: %d admitted from fallback, want all %d", tt.fb, w.bySource[hybrid.SourceFallback], w.allowed)
				}
				st := l.Stats()
				if st.FallbackAllowed != uint64(tt.want) || st.FallbackDenied != uint64(100-tt.want) {
					t.Errorf("Stats: FallbackAllowed %d, FallbackDenied %d, want %d, %d", st.FallbackAllowed, st.FallbackDenied, tt.want, 100-tt.want)
				}
				f.setDown(false)
				settle(2*openTimeout + interval)
				if st := l.Stats(); st.Degraded || st.Reconcile.Orphans != 0 {
					t.Errorf("after recovery: Degraded %v, %d orphans, want neither", st.Degraded, st.Reconcile.Orphans)
				}
				if tt.want == 0 {
					if f.m.Exists("hybrid:{k}") {
						t.Errorf("Redis has a bucket for k, want none: nothing was admitted")
					}
					return
				}
				// The key was never in Redis: its bucket starts full when
				// the outage is charged, and is charged in full (a minute's
				// refill is the most it may owe). Under LocalShare the share
				// claims back the refill it kept (9.9 tokens: it was spent
				// below its burst from the first decision to the last), as
				// far as the bucket's pool holds it: a bucket missing since
				// (expired once full, for all Redis can tell) lost the
				// refill since the outage began, less its burst, which is
				// less than a token here.
				slack := int64(0)
				if tt.fb == hybrid.LocalShare {
					slack = micro
				}
				wantTokens(t, f.m, "k", (10-tt.want)*micro, slack)
			})
		})
	}
}

// TestUnanswered: a Redis slower than ColdWait, with its breaker closed, is
// no outage. A request that waited ColdWait for it is denied (SourceRedis,
// counted in Stats.Unanswered), in every mode that waits for Redis (a cold
// lease key, an optimistic key's fetch, an Exact call), never decided by
// the fallback, whose shares the bucket does not account for. Once the
// calls' failures have opened the breaker, the fallback decides.
func TestUnanswered(t *testing.T) {
	const coldWait = 20 * time.Millisecond // below the call timeout: the request gives up first
	// Six failures in a row open the breaker: the three steps' calls and
	// the failed rounds of key o's consumption leave it closed until the
	// steps are done.
	cfg := hybrid.Config{ColdWait: coldWait, Instances: 1, Breaker: breaker.Config{ConsecutiveFailures: 6}}
	inFleet(t, 1, cfg, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		// A first optimistic request is admitted on trust; the second
		// fetches.
		opt := hybrid.Limit{Rate: 10, Burst: 10, Mode: hybrid.Optimistic}
		if res, err := l.Allow(ctx, "o", opt); err != nil || !res.Allowed || res.Source != hybrid.SourceLocal {
			t.Fatalf("Allow(o) = %+v, %v, want allowed on trust", res, err)
		}
		f.links[0].delay.Store(int64(60 * time.Millisecond)) // past the call timeout too
		steps := []struct {
			key string
			lim hybrid.Limit
		}{
			{"a", hybrid.Limit{Rate: 10, Burst: 10}},
			{"o", opt},
			{"x", hybrid.Limit{Rate: 10, Burst: 10, Mode: hybrid.Exact}},
		}
		for i, s := range steps {
			start := time.Now()
			res, err := l.Allow(ctx, s.key, s.lim)
			if err != nil || res.Allowed || res.Source != hybrid.SourceRedis {
				t.Errorf("step %d: Allow(%s, %v) = %+v, %v, want denied from redis", i, s.key, s.lim.Mode, res, err)
			}
			if took := time.Since(start); took > coldWait && s.lim.Mode != hybrid.Exact {
				t.Errorf("step %d: Allow took %v, want at most ColdWait %v", i, took, coldWait)
			}
			if res.RetryAfter <= 0 || res.RetryAfter > interval {
				t.Errorf("step %d: RetryAfter %v, want in (0, %v]", i, res.RetryAfter, interval)
			}
			if st := l.Stats(); st.Unanswered != uint64(i+1) || st.FallbackAllowed+st.FallbackDenied != 0 {
				t.Errorf("step %d: Unanswered %d, fallback decisions %d, want %d and 0", i, st.Unanswered, st.FallbackAllowed+st.FallbackDenied, i+1)
			}
			settle(50 * time.Millisecond) // the call fails at its timeout: the breaker counts it
		}
		for range 10 { // the rounds keep failing: the breaker opens
			if l.Stats().Degraded {
				break
			}
			settle(interval)
		}
		if st := l.Stats(); !st.Degraded {
			t.Fatalf("after calls past their timeout for 1s: breaker %v, want open", st.Reconcile.Breaker)
		}
		res, err := l.Allow(ctx, "b", hybrid.Limit{Rate: 10, Burst: 10})
		if err != nil || !res.Allowed || res.Source != hybrid.SourceFallback {
			t.Errorf("breaker open: Allow(b) = %+v, %v, want allowed by the fallback", res, err)
		}
		f.links[0].delay.Store(0)
		settle(2*openTimeout + interval)
	})
}

// TestRedisLosesData: Redis forgets everything (FLUSHALL) in the middle of a
// run. The fleet carries on without an error; the instances' heartbeats
// find that Redis lost their beats, and each charges again what its
// settlements took in the last three heartbeat intervals, so that over the
// whole run the fleet admits about B + R*T, not a burst more (lease: 77
// over 6 s against B + R*T of 80; 99 before the instances charged again).
// The key is not stuck: once that debt is repaid, it admits its rate.
func TestRedisLosesData(t *testing.T) {
	const (
		rate  = 10
		burst = 20
		gap   = 25 * time.Millisecond // each instance asks for 40/s: 8x the limit for two
	)
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		t.Run(mode.String(), func(t *testing.T) {
			lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: mode}
			inFleet(t, 2, hybrid.Config{}, func(t *testing.T, f *fleet) {
				settle(time.Second)
				start := time.Now()
				var before tally
				drive(f, "k", lim, gap, 2*time.Second, &before, nil)
				before.check(t)
				f.m.FlushAll()
				after := make([]tally, 4)
				got := before.allowed.Load()
				for i := range after {
					drive(f, "k", lim, gap, time.Second, &after[i], nil)
					after[i].check(t)
					got += after[i].allowed.Load()
				}
				var losses uint64
				for _, l := range f.lims {
					losses += l.Stats().Reconcile.Losses
				}
				t.Logf("admitted %d in the 2s before FLUSHALL, then %d, %d, %d, %d a second; %d heartbeats found Redis had lost the writes",
					before.allowed.Load(), after[0].allowed.Load(), after[1].allowed.Load(), after[2].allowed.Load(), after[3].allowed.Load(), losses)
				if losses == 0 {
					t.Errorf("no heartbeat found that Redis lost its writes")
				}
				// Over the run, B + R*T: within what the instances held
				// when Redis forgot (leases, budgets; at most B) and the
				// optimistic overshoot, and at least most of it.
				ideal := float64(burst) + rate*time.Since(start).Seconds()
				if hi := ideal + burst + float64(f.lims[0].Overshoot(lim)); float64(got) > hi {
					t.Errorf("admitted %d over the run, want at most %.0f (B + R*T %.0f)", got, hi, ideal)
				}
				if lo := 0.8 * ideal; float64(got) < lo {
					t.Errorf("admitted %d over the run, want at least %.0f (B + R*T %.0f)", got, lo, ideal)
				}
				// Not stuck: the last second admits the rate.
				if n := after[3].allowed.Load(); n < rate*8/10 {
					t.Errorf("admitted %d in the last second, want about %d", n, rate)
				}
				for i, l := range f.lims {
					st := l.Stats()
					if st.Degraded || st.FallbackAllowed+st.FallbackDenied != 0 || st.Reconcile.KeyErrors+st.Reconcile.FetchErrors != 0 {
						t.Errorf("instance %d: %+v, want no fallback and no errors", i, st)
					}
				}
				// What the flush lost is charged again down to -B at most;
				// an optimistic key's own charges, of what it admitted on
				// its budgets beyond the bucket, go further, within its
				// bound.
				lo := int64(-burst * micro)
				if mode == hybrid.Optimistic {
					lo -= f.lims[0].Overshoot(lim) * micro
				}
				if n := tokensIn(t, f.m, "k"); n < lo || n > burst*micro {
					t.Errorf("Redis bucket holds %d micro-tokens, want within [%d, %d]", n, lo, burst*micro)
				}
				if ms, _ := f.m.ZMembers("hybrid:fleet{fleet}"); len(ms) != 2 {
					t.Errorf("fleet after FLUSHALL: %q, want both instances back", ms)
				}
			})
		})
	}
}

// TestFailedRoundKeepsConsumption: rounds that fail keep what they were to
// settle, and the first round that succeeds settles it once: consumption
// is charged, not dropped and not charged twice, and unspent leases go back.
func TestFailedRoundKeepsConsumption(t *testing.T) {
	const burst = 100
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		t.Run(mode.String(), func(t *testing.T) {
			lim := hybrid.Limit{Rate: slow, Burst: burst, Mode: mode}
			inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				start := time.Now()
				admitted := int64(0)
				take := func(k int) {
					t.Helper()
					for range k {
						res, err := l.Allow(context.Background(), "k", lim)
						if err != nil || !res.Allowed {
							t.Fatalf("Allow = %+v, %v, want allowed", res, err)
						}
						admitted++
					}
				}
				steps := []struct {
					down bool // the link, during the step
					take int
					wait time.Duration
				}{
					{false, 5, interval / 2},
					{true, 5, 2 * interval}, // two rounds fail
					// With a heartbeat that failed too, the breaker may
					// have opened: it probes again after its open timeout.
					{false, 0, breaker.DefaultOpenTimeout + 3*interval},
				}
				for _, s := range steps {
					f.setDown(s.down)
					take(s.take)
					settle(s.wait)
				}
				st := l.Stats()
				// A lease whose key is not starved has nothing to send while
				// it still covers its requests: fewer of its rounds fail.
				if st.Reconcile.RoundErrors < 1 || st.Reconcile.KeyErrors < 1 {
					t.Errorf("Stats: %d round errors, %d key errors, want some: the test did not make a round fail", st.Reconcile.RoundErrors, st.Reconcile.KeyErrors)
				}
				if st.Reconcile.Orphans != 0 {
					t.Errorf("Stats: %d orphans, want 0", st.Reconcile.Orphans)
				}
				slack := int64(slow*micro*time.Since(start).Seconds()) + 1
				wantTokens(t, f.m, "k", (burst-admitted)*micro, slack)
			})
		})
	}
}

// TestWrongType: a bucket key overwritten while in use (a SET of another
// value over the bucket) is replaced by a full bucket at the key's next
// settlement (an Exact key's next decision): decisions on it go on without
// an error and without the fallback, the replacement is counted
// (Stats().Reconcile.Resets), other keys and the breaker are not affected,
// and the key is a bucket again within one round.
func TestWrongType(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			const burst = 20
			lim := hybrid.Limit{Rate: 20, Burst: burst, Mode: mode}
			other := hybrid.Limit{Rate: 1000, Burst: 1000, Mode: mode} // never denies here
			inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				ctx := context.Background()
				const gap = 10 * time.Millisecond // 5x the limit
				// run asks for k and other every gap for d, and returns k's
				// decisions.
				run := func(phase string, d time.Duration) window {
					t.Helper()
					var w window
					for i := 0; time.Duration(i)*gap < d; i++ {
						res, err := l.Allow(ctx, "k", lim)
						if err != nil {
							t.Fatalf("%s: Allow(k) = %v, want no error", phase, err)
						}
						w.add(res)
						res, err = l.Allow(ctx, "other", other)
						if err != nil || !res.Allowed || res.Source == hybrid.SourceFallback {
							t.Fatalf("%s: Allow(other) = %+v, %v, want allowed with Redis", phase, res, err)
						}
						time.Sleep(gap)
					}
					return w
				}
				run("before", 300*time.Millisecond)
				const overwrites = 3
				var all window
				for i := range overwrites {
					f.m.Del("hybrid:{k}") // miniredis's SET, unlike Redis's, keeps a key's type
					if err := f.m.Set("hybrid:{k}", "x"); err != nil {
						t.Fatal(err)
					}
					// The key's next settlement replaces it: within a round
					// for an Optimistic key, at once for an Exact one, and
					// when its lease runs low for a Lease key.
					within := interval + gap
					if mode == hybrid.Lease {
						within = time.Second
					}
					start := time.Now()
					for _, _, ok, err := redistest.MiniBucket(f.m, "hybrid:{k}"); !ok || err != nil; _, _, ok, err = redistest.MiniBucket(f.m, "hybrid:{k}") {
						if time.Since(start) > within {
							t.Fatalf("overwrite %d: hybrid:{k} is still a %q after %v, want a bucket again", i+1, f.m.Type("hybrid:{k}"), within)
						}
						w := run(fmt.Sprintf("overwrite %d", i+1), gap)
						all.allowed += w.allowed
						all.denied += w.denied
						for s := range all.bySource {
							all.bySource[s] += w.bySource[s]
						}
					}
					t.Logf("overwrite %d: replaced by a bucket %v later", i+1, time.Since(start))
				}
				st := l.Stats()
				t.Logf("after %d overwrites: k %+v; stats %+v", overwrites, all, st)
				if all.bySource[hybrid.SourceFallback] != 0 || all.allowed == 0 {
					t.Errorf("k after the overwrites: %+v, want admissions, none by the fallback", all)
				}
				if n := st.Reconcile.KeyErrors + st.Reconcile.FetchErrors + st.ExactErrors; n != 0 {
					t.Errorf("%d errors counted, want none: the overwritten key is replaced, not failed", n)
				}
				if mode != hybrid.Exact && st.Reconcile.Resets != overwrites {
					t.Errorf("Stats().Reconcile.Resets = %d, want %d: one per overwrite", st.Reconcile.Resets, overwrites)
				}
				if st.Degraded || st.Reconcile.Transitions != 0 {
					t.Errorf("Degraded %v, %d breaker transitions, want the breaker untouched", st.Degraded, st.Reconcile.Transitions)
				}
				if n := tokensIn(t, f.m, "k"); n < -burst*micro || n > burst*micro {
					t.Errorf("the bucket holds %d micro-tokens, want a valid bucket", n)
				}
			})
		})
	}
}
