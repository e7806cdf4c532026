package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/reconcile"
)

// The property tests draw random schedules (a limit, a mode, a fleet, costs,
// arrival times and link cuts), run each in a synctest bubble on miniredis,
// and check the accuracy contract of docs/accuracy.md on every one.
//
// The seed of the first schedule is printed; set HYBRID_SEED to it to draw
// the same schedules again (the interleaving of the instances' goroutines
// may still differ).

// envSeed names the environment variable that fixes the first seed.
const envSeed = "HYBRID_SEED"

// propertySchedules is how many schedules TestPropertyAccuracy draws.
const propertySchedules = 48

// schedule is one random run.
type schedule struct {
	seed      uint64
	instances int
	mode      hybrid.Mode
	lim       hybrid.Limit
	keys      int
	maxCost   int64
	interval  time.Duration // Config.SyncInterval
	capacity  int64         // Config.LocalCapacity, 0 for the default
	d         time.Duration // how long the requests go on
	rates     []float64     // requests per second, per instance
	cuts      []linkCut
}

// linkCut cuts the links of some instances for a while.
type linkCut struct {
	at, d time.Duration // from the start of the requests
	insts []int
}

func (c linkCut) String() string { return fmt.Sprintf("cut %v at %v for %v", c.insts, c.at, c.d) }

func (s schedule) String() string {
	return fmt.Sprintf("seed %d: %d instances, %v, R=%v B=%d, %d keys, costs 1..%d, interval %v, capacity %d, %v, requests/s per instance %.3g, %v",
		s.seed, s.instances, s.mode, s.lim.Rate, s.lim.Burst, s.keys, s.maxCost, s.interval, s.capacity, s.d, s.rates, s.cuts)
}

// drawSchedule draws the schedule of seed.
func drawSchedule(seed uint64) schedule {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	s := schedule{seed: seed, instances: 1 + r.IntN(4), keys: 1 + r.IntN(3)}
	s.mode = []hybrid.Mode{hybrid.Lease, hybrid.Lease, hybrid.Optimistic, hybrid.Optimistic, hybrid.Exact}[r.IntN(5)]
	rate := math.Exp(r.Float64() * math.Log(300)) // 1 to 300 tokens/s
	s.lim = hybrid.Limit{Rate: math.Round(rate*1000) / 1000, Burst: 1 + int64(math.Exp(r.Float64()*math.Log(100))), Mode: s.mode}
	s.maxCost = 1 + r.Int64N(min(s.lim.Burst, 4))
	s.interval = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}[r.IntN(3)]
	if r.IntN(2) == 1 {
		s.capacity = 1 + r.Int64N(64)
	}
	s.d = time.Duration(2+r.IntN(5)) * time.Second
	// Demand from half the limit to six times it, spread unevenly.
	demand := s.lim.Rate * (0.5 + 5.5*r.Float64()) / (float64(1+s.maxCost) / 2)
	for range s.instances {
		s.rates = append(s.rates, max(demand*(0.2+r.Float64())/float64(s.instances), 0.5))
	}
	// Up to two cuts that do not overlap, each short enough that no
	// instance drops out of the others' live count (3 heartbeats).
	at := 200*time.Millisecond + time.Duration(r.Int64N(int64(s.d/2)))
	for range r.IntN(3) {
		c := linkCut{at: at, d: time.Duration(100+r.IntN(1700)) * time.Millisecond}
		if r.IntN(2) == 0 {
			for i := range s.instances {
				c.insts = append(c.insts, i)
			}
		} else {
			c.insts = []int{r.IntN(s.instances)}
		}
		if c.at+c.d > s.d {
			break
		}
		s.cuts = append(s.cuts, c)
		at = c.at + c.d + 1200*time.Millisecond
	}
	return s
}

// event is one decision of a schedule.
type event struct {
	at      time.Duration // since the start of the requests
	inst    int
	key     string
	cost    int64 // micro-tokens
	allowed bool
	source  hybrid.Source
	n       int64 // the instance's fleet size when it fell back
}

// TestPropertyAccuracy runs propertySchedules random schedules and checks
// on each, for every key and at every decision:
//
//   - no decision fails;
//   - each instance's fallback admissions are within what LocalShare's
//     local bucket (R/N and B/N, at least the cost) can give over their
//     times;
//   - the other admissions up to time t are within B + R*t, plus
//     Limiter.Overshoot in optimistic mode (docs/accuracy.md: the lease and
//     exact bounds are exact, the optimistic one is derived there).
func TestPropertyAccuracy(t *testing.T) {
	base := uint64(time.Now().UnixNano())
	if s := os.Getenv(envSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
		base = v
	}
	t.Logf("first seed %d (%s=%d reproduces these schedules)", base, envSeed, base)
	for i := range uint64(propertySchedules) {
		s := drawSchedule(base + i)
		t.Run("seed="+strconv.FormatUint(s.seed, 10), func(t *testing.T) {
			runSchedule(t, s)
		})
	}
}

// runSchedule runs s in a bubble and checks the contract.
func runSchedule(t *testing.T, s schedule) {
	cfg := hybrid.Config{SyncInterval: s.interval, LocalCapacity: s.capacity}
	inFleet(t, s.instances, cfg, func(t *testing.T, f *fleet) {
		settle(time.Second) // heartbeats: every instance counts the fleet
		overshoot := f.lims[0].Overshoot(s.lim)
		start := time.Now()
		events := make([][]event, s.instances)
		var wg sync.WaitGroup
		for i, l := range f.lims {
			r := rand.New(rand.NewPCG(s.seed, uint64(i)))
			wg.Go(func() {
				for {
					time.Sleep(time.Duration(r.ExpFloat64() / s.rates[i] * float64(time.Second)))
					at := time.Since(start)
					if at >= s.d {
						return
					}
					key := "k" + strconv.Itoa(r.IntN(s.keys))
					cost := 1 + r.Int64N(s.maxCost)
					res, err := l.AllowN(context.Background(), key, s.lim, cost)
					if err != nil {
						t.Errorf("%v: instance %d at %v: AllowN(%s, %d) = %v", s, i, at, key, cost, err)
						return
					}
					e := event{at: at, inst: i, key: key, cost: cost * micro, allowed: res.Allowed, source: res.Source}
					if res.Source == hybrid.SourceFallback {
						// The count is frozen while the link is cut.
						e.n = l.Stats().Reconcile.Instances
					}
					events[i] = append(events[i], e)
				}
			})
		}
		wg.Go(func() {
			for _, c := range s.cuts {
				time.Sleep(c.at - time.Since(start))
				for _, i := range c.insts {
					f.links[i].down.Store(true)
				}
				time.Sleep(c.d)
				for _, i := range c.insts {
					f.links[i].down.Store(false)
				}
			}
		})
		wg.Wait()
		if t.Failed() {
			return
		}
		checkSchedule(t, s, slices.Concat(events...), overshoot)
		// Back to normal: every instance settles, no bucket below -D, the
		// debt's bound (a minute's refill by default: what the fallback
		// admitted is charged in full).
		settle(2*openTimeout + 3*s.interval)
		f.close(t)
		debt := max(s.lim.Burst*micro, int64(s.lim.Rate*micro)*int64(reconcile.DefaultMaxDebt/time.Second))
		for k := range s.keys {
			key := "k" + strconv.Itoa(k)
			if !f.m.Exists("hybrid:{" + key + "}") {
				continue
			}
			if got := tokensIn(t, f.m, key); got < -debt || got > s.lim.Burst*micro {
				t.Errorf("%v: Redis bucket %s holds %d micro-tokens, outside [-D, B] (D %d)", s, key, got, debt)
			}
		}
	})
}

// checkSchedule checks the contract on the events of s.
func checkSchedule(t *testing.T, s schedule, events []event, overshoot int64) {
	t.Helper()
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
	rate := int64(math.Round(s.lim.Rate * micro)) // micro-tokens per second
	burst := s.lim.Burst * micro
	extra := overshoot * micro
	var total, fromFallback int
	for k := range s.keys {
		key := "k" + strconv.Itoa(k)
		var admitted int64 // not by the fallback, micro-tokens
		fallback := make([]fallbackBound, s.instances)
		for _, e := range events {
			if e.key != key || !e.allowed {
				continue
			}
			if e.source == hybrid.SourceFallback {
				if got, bound := fallback[e.inst].add(e, s.lim, cutOf(s, e)); got > bound {
					t.Fatalf("%v\nkey %s: instance %d admitted %d micro-tokens by its fallback up to %v, more than LocalShare's local bucket allows, %d",
						s, key, e.inst, got, e.at, bound)
				}
				continue
			}
			admitted += e.cost
			// admitted <= B + R*t + E, in micro-token-nanoseconds.
			lhs := new(big.Int).Mul(big.NewInt(admitted-burst-extra), big.NewInt(int64(time.Second)))
			if rhs := new(big.Int).Mul(big.NewInt(rate), big.NewInt(int64(e.at))); lhs.Cmp(rhs) > 0 {
				t.Fatalf("%v\nkey %s: %d micro-tokens admitted (not by the fallback) by %v, more than B + R*t + E = %d + %d + %d",
					s, key, admitted, e.at, burst, new(big.Int).Quo(rhs, big.NewInt(int64(time.Second))), extra)
			}
		}
		for _, fb := range fallback {
			fromFallback += int(fb.admitted / micro)
		}
		total += int(admitted / micro)
	}
	t.Logf("%v: %d decisions; admitted %d tokens by leases and budgets, %d by the fallback; E = %d", s, len(events), total, fromFallback, overshoot)
}

// fallbackBound follows one instance's fallback admissions on one key and
// the most that LocalShare's local bucket can give over their times: the
// bucket is full (B/N, at least the cost) when first used, refills at R/N
// (at least one micro-token a second) and never holds more than its burst,
// so the admissions are at most one burst plus, between two of them, the
// refill over the gap but never more than a burst. The refill's remainder
// is carried from gap to gap, as the bucket carries it: flooring each gap
// alone made the bound a few micro-tokens short over many small gaps.
type fallbackBound struct {
	admitted, bound int64 // micro-tokens
	cut             int   // the cut of the last admission (cutOf)
	last            event
	burst           int64    // the largest burst the bucket had
	rem             *big.Int // the refill's remainder, in micro-token nanoseconds: the bucket carries it
}

// cutOf returns how many of s's link cuts began at or before e: an
// admission by the fallback after the k-th cut began belongs to its outage
// or a later one.
func cutOf(s schedule, e event) int {
	k := 0
	for _, c := range s.cuts {
		if c.at <= e.at {
			k++
		}
	}
	return k
}

// add counts e, made in cut (the number of the link cut it came in or
// after, see cutOf), and returns the admissions so far and their bound. A
// share may start anew from its seed (at most its burst) at the first
// decision of a cut, as the local bucket of a new outage does.
func (b *fallbackBound) add(e event, lim hybrid.Limit, cut int) (admitted, bound int64) {
	n := max(e.n, 1)
	burst := max(lim.Burst*micro/n, micro, e.cost)
	fresh := cut != b.cut
	b.cut = cut
	if b.admitted == 0 {
		b.burst = burst
		b.bound = burst
	} else if fresh {
		b.burst = max(b.burst, burst)
		b.bound = max(b.bound+b.burst, b.admitted+b.burst)
		if b.rem != nil {
			b.rem.SetInt64(0)
		}
	} else {
		b.burst = max(b.burst, burst)
		rate := max(int64(math.Round(lim.Rate*micro))/min(n, max(b.last.n, 1)), 1)
		if b.rem == nil {
			b.rem = new(big.Int)
		}
		refill := new(big.Int).Mul(big.NewInt(rate), big.NewInt(int64(e.at-b.last.at)))
		refill.Add(refill, b.rem)
		refill.QuoRem(refill, big.NewInt(int64(time.Second)), b.rem)
		if refill.IsInt64() && refill.Int64() < b.burst {
			b.bound += refill.Int64()
		} else {
			b.bound += b.burst
			b.rem.SetInt64(0)
		}
	}
	b.admitted += e.cost
	b.last = e
	return b.admitted, b.bound
}
