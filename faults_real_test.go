package hybrid_test

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/lua"
)

// The fault matrix: a Limiter fleet against a real redis-server (started by
// internal/redistest on a loopback port) while Redis forgets its data and
// scripts, a bucket key is overwritten with another type, the limiter's
// connections are killed, and the network between them (an in-test proxy)
// turns slow, drops connections and black-holes them; and, on miniredis in
// a synctest bubble, while Redis's clock is far from the instances' or
// jumps. Each fault checks the same contract:
//
//   - every decision answers, without error, within ColdWait (and
//     scheduling slack);
//   - what was admitted is charged to Redis once it is back, once: the
//     bucket of a key with a burst too large to run out ends at B minus what
//     the fleet admitted (a settlement whose reply was lost is sent again,
//     and Redis tells that it applied it already; a lease key may end lower:
//     a fetch whose reply is lost loses its grant, which errs towards
//     denying);
//   - service is normal again (breaker closed, a settlement round that
//     succeeded, decisions from the allowance or Redis) within one round of
//     the fault's end, plus, if the breaker had opened, its open timeout
//     (the tests allow two: a probe lost to a stall of a loaded machine
//     costs one more; they log what they measured);
//   - Close leaves no goroutine behind.
//
// Load is paced with tickers (load generation, not synchronisation). The
// waits are on breaker transitions (OnStateChange) or bounded polls on a
// condition that nothing signals (a round done, a key's type in Redis, the
// goroutine count). A stall of the whole process (the load's stall watch,
// see faultLoad) excuses what it may have caused, with a log line saying so.

// TestFaultFlush: Redis forgets its data (FLUSHALL) and its scripts (SCRIPT
// FLUSH) in the middle of a run at 4x the limit, in every mode. No decision
// fails or falls back, no error is counted (NOSCRIPT is answered by sending
// the script again), the breaker does not move; the buckets start full
// again, and each instance's next heartbeat finds that Redis lost its beat
// and charges again what its settlements took in the last three heartbeat
// intervals (down to -B), so each key admits between R*T - B and B + R*T
// after the flush.
func TestFaultFlush(t *testing.T) {
	const rate, burst = 100, 50
	keys := []faultKey{
		{name: "flush-lease", lim: hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Lease}, every: 4},
		{name: "flush-optimistic", lim: hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Optimistic}, every: 4},
		{name: "flush-exact", lim: hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Exact}, every: 4},
	}
	// 2 instances x 2 workers, each asking for each key every 16ms: 250/s
	// per key, 2.5x the rate.
	srv, admin := faultServer(t)
	ctx := t.Context()
	baseline := runtime.NumGoroutine()
	f := faultFleet(t, srv.Addr(), 2, "flush")
	load := startFaultLoad(f, 2, keys)

	start := time.Now()
	<-time.After(time.Second)
	flushAt := time.Now()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	t1 := redisTime(t, admin)
	// Each key's bucket is back within a round (Exact: at its next
	// decision). Bounded poll: nothing signals a round.
	var back time.Duration
	tick := time.NewTicker(2 * time.Millisecond)
	for _, fk := range keys {
		for admin.Exists(ctx, "hybrid:{"+fk.name+"}").Val() == 0 {
			if time.Since(flushAt) > faultSync+faultMargin {
				t.Errorf("%s: no bucket in Redis %v after FLUSHALL", fk.name, time.Since(flushAt))
				break
			}
			<-tick.C
		}
		back = max(back, time.Since(flushAt))
	}
	tick.Stop()
	<-time.After(1500 * time.Millisecond)
	end := time.Now()
	t2 := redisTime(t, admin)
	load.end(t)

	load.check(t, span{"before the flush", start, flushAt})
	after := span{"after the flush", flushAt, end}
	load.check(t, after)
	load.wantNoFallback(t, after)
	t.Logf("every bucket was back in Redis %v after FLUSHALL", back.Round(time.Millisecond))
	window := t2.Sub(t1)
	ideal := burst + rate*window.Seconds()
	lo := 0.8 * ideal
	var losses uint64
	for _, in := range f {
		losses += in.lim.Stats().Reconcile.Losses
	}
	if losses > 0 {
		lo = 0.8 * (ideal - 2*burst) // charged again down to -B
	}
	t.Logf("%d heartbeats found Redis had lost the instances' writes", losses)
	for k, fk := range keys {
		var got int64
		for _, d := range load.all {
			if d.key == k && d.allowed && !d.start.Before(flushAt) && d.start.Before(end) {
				got++
			}
		}
		// Allowance held when Redis forgot (at most a burst) is spent once
		// more; an optimistic fleet may overshoot by its bound.
		hi := ideal + burst + float64(f[0].lim.Overshoot(fk.lim))
		if fk.lim.Mode == hybrid.Exact {
			hi = ideal + 1 // a decision in flight across the flush
		}
		t.Logf("%s: admitted %d in the %v after the flush; B + R*T = %.1f", fk.name, got, window.Round(time.Millisecond), ideal)
		if float64(got) < lo || float64(got) > hi {
			t.Errorf("%s: admitted %d after the flush, want between %.1f and %.1f", fk.name, got, lo, hi)
		}
	}
	if ok, err := admin.ScriptExists(ctx, redis.NewScript(lua.Settle).Hash()).Result(); err != nil || !ok[0] {
		t.Errorf("SCRIPT EXISTS settle = %v, %v; want it loaded again", ok, err)
	}
	stall, stalled := load.stalled(span{"the run", start, end})
	for i, in := range f {
		st := in.lim.Stats()
		n := st.Reconcile.KeyErrors + st.Reconcile.FetchErrors + st.Reconcile.RoundErrors + st.Reconcile.HeartbeatErrors + st.ExactErrors
		switch {
		case n == 0 && st.Reconcile.Transitions == 0:
		case stalled:
			t.Logf("instance %d: %d errors, %d breaker transitions; not checked: the process stalled for %v", i, n, st.Reconcile.Transitions, stall)
		default:
			t.Errorf("instance %d: %d errors, %d breaker transitions, want none: %+v", i, n, st.Reconcile.Transitions, st)
		}
	}
	closeFleet(t, f, baseline)
}

// TestFaultWrongType: a bucket key in use is overwritten with a string (a
// SET on the hash), three times, in every mode, on a real Redis. The
// script replaces it with a full bucket at the key's next settlement (an
// Exact key's next decision): no decision fails or falls back, no error is
// counted, the breaker does not move, and Stats().Reconcile.Resets counts
// the replacements.
func TestFaultWrongType(t *testing.T) {
	keys := []faultKey{
		{name: "wt-lease", lim: hybrid.Limit{Rate: 100, Burst: 50, Mode: hybrid.Lease}, every: 4},
		{name: "wt-optimistic", lim: hybrid.Limit{Rate: 100, Burst: 50, Mode: hybrid.Optimistic}, every: 4},
		{name: "wt-exact", lim: hybrid.Limit{Rate: 100, Burst: 50, Mode: hybrid.Exact}, every: 4},
		{name: "wt-other", lim: hybrid.Limit{Rate: 1e6, Burst: 1e6}, every: 4},
	}
	const overwrites = 3
	srv, admin := faultServer(t)
	ctx := t.Context()
	baseline := runtime.NumGoroutine()
	f := faultFleet(t, srv.Addr(), 1, "wrongtype")
	load := startFaultLoad(f, 2, keys)

	start := time.Now()
	<-time.After(500 * time.Millisecond)
	faultAt := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	for round := range overwrites {
		for _, fk := range keys[:3] {
			rk := "hybrid:{" + fk.name + "}"
			set := time.Now()
			if err := admin.Set(ctx, rk, "not a bucket", 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", rk, err)
			}
			// A key in use is settled every round, or sooner; a lease
			// key when its lease runs low, which at 2x its rate is
			// well within a second.
			within := faultSync + faultMargin
			if fk.lim.Mode == hybrid.Lease {
				within = time.Second
			}
			for _, _, ok, err := redistest.Bucket(ctx, admin, rk); !ok || err != nil; _, _, ok, err = redistest.Bucket(ctx, admin, rk) {
				if time.Since(set) > within {
					t.Fatalf("overwrite %d: %s is still a %s %v after the SET, want a bucket again", round+1, rk, admin.Type(ctx, rk).Val(), within)
				}
				<-tick.C
			}
			t.Logf("overwrite %d: %s replaced by a bucket %v after the SET", round+1, fk.name, time.Since(set).Round(time.Millisecond))
		}
	}
	tick.Stop()
	faultEnd := time.Now()
	<-time.After(300 * time.Millisecond)
	load.end(t)
	end := time.Now()

	load.check(t, span{"before", start, faultAt})
	over := span{"overwrites", faultAt, end}
	load.check(t, over)
	load.wantNoFallback(t, over)
	t.Logf("the overwrites took %v", faultEnd.Sub(faultAt).Round(time.Millisecond))
	st := f[0].lim.Stats()
	t.Logf("stats: %+v", st)
	// The lease and optimistic keys are settled by the reconciler, which
	// counts each replacement once; the exact key is not.
	n := st.Reconcile.KeyErrors + st.Reconcile.FetchErrors + st.ExactErrors
	if n > 0 || st.Reconcile.Transitions > 0 || st.Degraded || st.Reconcile.Resets != 2*overwrites {
		// A settlement that timed out may have replaced the key all the
		// same: its reset is then not counted.
		msg := fmt.Sprintf("%d errors, %d breaker transitions, Degraded %v, Stats().Reconcile.Resets = %d; want no error, no transition and %d resets: the key is replaced, not failed",
			n, st.Reconcile.Transitions, st.Degraded, st.Reconcile.Resets, 2*overwrites)
		if stall, stalled := load.stalled(span{"the run", start, end}); stalled {
			t.Logf("%s; not checked: the process stalled for %v", msg, stall)
		} else {
			t.Error(msg)
		}
	}
	for k := range keys {
		var n int64
		for _, d := range load.all {
			if d.key == k && d.allowed && !d.start.Before(faultEnd) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: nothing admitted after the overwrites", keys[k].name)
		}
	}
	closeFleet(t, f, baseline)
}

// TestFaultProxy: the network between the fleet and Redis, an in-test TCP
// proxy, turns bad three ways in turn, with the load running:
//
//  1. 200ms of latency each way, four times the call timeout;
//  2. every connection dropped and new ones refused;
//  3. a black hole: connections accepted and kept, nothing forwarded
//     (half-open sockets that never answer).
//
// In each, the breakers open, decisions keep answering within their bound
// (the fallback decides), and within a round plus the open timeout of the
// fault's end (two allowed) every instance is normal again. At the end, what
// was admitted is in Redis.
func TestFaultProxy(t *testing.T) {
	keys := append(slices.Clone(conserveKeys),
		faultKey{name: "proxy-cold", lim: hybrid.Limit{Rate: 1000, Burst: 1000}, every: 10, cold: true})
	srv, admin := faultServer(t)
	px := redistest.ProxyTo(t, srv.Addr())
	baseline := runtime.NumGoroutine()
	f := faultFleet(t, px.Addr(), 2, "proxy")
	load := startFaultLoad(f, 2, keys)

	// What each stretch of the run expects of the fallback.
	type stretch struct {
		span
		fallback string // "none", "some", or "" for no expectation
	}
	start := time.Now()
	<-time.After(500 * time.Millisecond)
	stretches := []stretch{{span{"normal", start, time.Now()}, "none"}}
	faults := []struct {
		name     string
		on, off  func()
		duration time.Duration
	}{
		{"200ms latency", func() { px.SetLatency(200*time.Millisecond, 200*time.Millisecond) }, func() { px.SetLatency(0, 0) }, 1500 * time.Millisecond},
		{"dropped and refused", func() {
			if err := px.SetRefuse(true); err != nil {
				t.Error(err)
			}
			px.DropAll()
		}, func() {
			if err := px.SetRefuse(false); err != nil {
				t.Error(err)
			}
		}, time.Second},
		{"black hole", func() { px.SetBlackhole(true) }, func() { px.SetBlackhole(false) }, 1500 * time.Millisecond},
	}
	for _, fault := range faults {
		marks := f.marks()
		at := time.Now()
		fault.on()
		opened := awaitOpen(t, f, marks, at, fault.name)
		if rest := fault.duration - time.Since(at); rest > 0 {
			<-time.After(rest)
		}
		for i, in := range f {
			if !in.lim.Stats().Degraded {
				t.Errorf("%s: instance %d not degraded at the end of the fault", fault.name, i)
			}
		}
		offAt := time.Now()
		fault.off()
		took := awaitNormal(t, f, load, marks, offAt, fault.name)
		normalAt := offAt.Add(took)
		t.Logf("%s: breakers open %v after the fault began; normal again %v after it ended; transitions %v, %v",
			fault.name, opened.Round(time.Millisecond), took.Round(time.Millisecond), f[0].states.since(marks[0]), f[1].states.since(marks[1]))
		<-time.After(200 * time.Millisecond)
		stretches = append(stretches,
			stretch{span{fault.name, at, offAt}, "some"},
			stretch{span{"recovery from " + fault.name, offAt, normalAt}, ""},
			stretch{span{"after " + fault.name, normalAt, time.Now()}, "none"})
	}
	load.end(t)
	for _, s := range stretches {
		n := load.check(t, s.span)
		if s.fallback == "none" {
			// A connection that the fault left broken fails at its first
			// use after it with EOF: its call is sent again on another
			// (reconcile.Reconciler.SettleNow), and a second broken one in
			// a row sends that request to the fallback (before the call
			// was sent again, 1 or 2 decisions of a few hundred in about
			// one run of ten after the latency fault; an outage the
			// breakers missed would be many).
			load.wantFallbackAtMost(t, s.span, 2)
			load.wantSteady(t, f, s.span)
		}
		if s.fallback == "some" && n == 0 {
			t.Errorf("%s: no decision by the fallback: the fault did not reach the limiter", s.name)
		}
	}
	closeFleet(t, f, baseline)
	checkConserved(t, admin, load, f)
}

// TestFaultClockSkew: Redis TIME is the buckets' only clock. Two instances,
// started ten minutes apart (their monotonic clocks differ by as much),
// share a key at 4x its limit while Redis's clock is decades ahead of or
// behind theirs, or jumps. On miniredis in a synctest bubble, so that every
// clock is exact.
//
// With a constant skew the fleet admits B + R*T over the window (at most,
// and at least 97% of it: the rest is the leases held at the end), T counted
// on either clock, and the bucket holds exactly B + R*T minus what was
// admitted. A clock that jumps
// back mints nothing: the bucket refills only once Redis's time is past the
// latest it has written, so the fleet admits at most B + R*(T - jump). A
// clock that jumps ahead refills the bucket at most to its burst: at most B
// more.
func TestFaultClockSkew(t *testing.T) {
	const (
		rate, burst = 100, 100
		d           = 6 * time.Second
		year        = 365 * 24 * time.Hour
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst}
	tests := []struct {
		name string
		skew time.Duration // Redis TIME minus the instances' clock
		jump time.Duration // added to skew a third of the way into the window
	}{
		{"redis 30 years ahead", 30 * year, 0},
		{"redis 20 years behind", -20 * year, 0},
		{"redis jumps back 2s", 0, -2 * time.Second},
		{"redis 30 years ahead jumps back 1h", 30 * year, -time.Hour},
		{"redis jumps ahead 1h", 0, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			synctest.Test(t, func(t *testing.T) {
				f := newFleet(t, m, 1, hybrid.Config{})
				f.setSkew(tt.skew)
				time.Sleep(10 * time.Minute)
				f.add(t, hybrid.Config{}, "b")
				settle(time.Second) // heartbeats: both count the fleet
				for i, l := range f.lims {
					if n := l.Stats().Reconcile.Instances; n != 2 {
						t.Fatalf("instance %d counts %d instances, want 2", i, n)
					}
				}
				start := time.Now().Add(tt.skew) // Redis time of the bucket's first write
				var jumper sync.WaitGroup
				if tt.jump != 0 {
					jumper.Go(func() {
						time.Sleep(d / 3)
						f.setSkew(tt.skew + tt.jump)
					})
				}
				var c tally
				gap := time.Second * 2 / (4 * rate) // 4x the limit over the fleet
				drive(f, "skewed", lim, gap, d, &c, nil)
				jumper.Wait()
				c.check(t)
				f.close(t) // leases go back
				noFaults(t, f)

				// The bucket's clock: how far Redis TIME moved past its
				// first write, as the bucket counts it (its ts never moves
				// back).
				_, ts, _, err := redistest.MiniBucket(m, "hybrid:{skewed}")
				if err != nil {
					t.Fatalf("bucket: %v", err)
				}
				elapsed := time.UnixMicro(ts).Sub(start)
				// The bucket's last write comes up to a round before the
				// window's end: the instances fetch the key in turns.
				want, early := d, interval
				switch {
				case tt.jump < 0 && -tt.jump < d*2/3:
					want = d + tt.jump
				case tt.jump < 0:
					// Redis time never gets back past the jump: the bucket's
					// clock stops at its last write before it, up to a round
					// earlier.
					want, early = d/3, interval
				case tt.jump > 0:
					want = d + tt.jump
				}
				if elapsed < want-early || elapsed > want+gap {
					t.Errorf("the bucket's clock moved %v over the window, want %v (-%v, +%v)", elapsed, want, early, gap)
				}
				got := c.allowed.Load()
				refill := rate * min(elapsed, d).Seconds()
				ideal := burst + refill
				hi := ideal
				if tt.jump > 0 {
					hi += burst // the jump refills the bucket, to its burst at most
				}
				tokens := tokensIn(t, m, "skewed")
				t.Logf("admitted %d over %v of the instances' clocks; the bucket's clock moved %v; B + R*T = %.0f; bucket left with %.3f tokens",
					got, d, elapsed, ideal, float64(tokens)/micro)
				if float64(got) > hi {
					t.Errorf("admitted %d, more than %.0f: tokens minted", got, hi)
				}
				// The leases held when the load stops go back at Close:
				// they, and a round's refill, are what the fleet did not
				// admit.
				if float64(got) < 0.97*ideal {
					t.Errorf("admitted %d, less than 97%% of B + R*T = %.0f", got, ideal)
				}
				if tt.jump <= 0 {
					// Conservation, exact to the micro-token: what the
					// bucket was given (B and R*elapsed) is what the fleet
					// admitted plus what is left.
					if want := burst*micro + int64(rate*micro*elapsed.Seconds()) - got*micro; tokens != want {
						t.Errorf("the bucket holds %d micro-tokens, want B + R*T - admitted = %d", tokens, want)
					}
				}
			})
		})
	}
}
