package local

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func mustLimit(t testing.TB, r float64, b int64) Limit {
	t.Helper()
	lim, err := NewLimit(r, b)
	if err != nil {
		t.Fatalf("NewLimit(%v, %d): %v", r, b, err)
	}
	return lim
}

// TestBucketSteps walks one bucket through timed steps, in the manner of
// x/time/rate's tests: capacity 10, refill 5/s.
func TestBucketSteps(t *testing.T) {
	lim := mustLimit(t, 5, 10)
	ms := time.Millisecond
	type step struct {
		at   time.Duration
		n    int64 // tokens
		ok   bool
		left int64 // Remaining after the step
		wait time.Duration
	}
	steps := []step{
		{0, 10, true, 0, 200 * ms},       // the burst at once
		{0, 1, false, 0, 200 * ms},       // the 11th
		{199 * ms, 1, false, 0, ms},      // not yet
		{200 * ms, 1, true, 0, 200 * ms}, // one token every 200ms
		{1200 * ms, 5, true, 0, 200 * ms},
		{1200 * ms, 1, false, 0, 200 * ms},
		{3200 * ms, 3, true, 7, 0}, // 2s idle: full again
		{3200 * ms, 8, false, 7, 0},
		{100 * ms, 7, true, 0, 200 * ms}, // time going back counts as the last time
		{100 * ms, 1, false, 0, 200 * ms},
	}
	b := Full(lim, 0)
	for i, s := range steps {
		if got := b.TakeAt(s.at, lim, s.n*Micro); got != s.ok {
			t.Fatalf("step %d: TakeAt(%v, %d) = %v, want %v", i, s.at, s.n, got, s.ok)
		}
		if got := b.Remaining(s.at, lim); got != s.left {
			t.Errorf("step %d: Remaining(%v) = %d, want %d", i, s.at, got, s.left)
		}
		if got := b.RetryAfter(s.at, lim, Micro); got != s.wait {
			t.Errorf("step %d: RetryAfter(%v, 1) = %v, want %v", i, s.at, got, s.wait)
		}
	}
}

func TestChargeAndPut(t *testing.T) {
	lim := mustLimit(t, 10, 100)
	b := Full(lim, 0)
	b.Charge(0, lim, 150*Micro)
	if got, want := b.Tokens(0, lim), int64(-50*Micro); got != want {
		t.Fatalf("after Charge(150) Tokens = %d, want %d", got, want)
	}
	b.Charge(0, lim, 1000*Micro)
	if got, want := b.Tokens(0, lim), -lim.Burst; got != want {
		t.Fatalf("debt sinks to %d, want floor %d", got, want)
	}
	if got, want := b.ResetAfter(0, lim), 20*time.Second; got != want {
		t.Errorf("ResetAfter from -B = %v, want %v", got, want)
	}
	b.Put(time.Second, lim, 500*Micro)
	if got, want := b.Tokens(time.Second, lim), lim.Burst; got != want {
		t.Errorf("Put caps at burst: Tokens = %d, want %d", got, want)
	}
	if got := b.ResetAfter(time.Second, lim); got != 0 {
		t.Errorf("ResetAfter when full = %v, want 0", got)
	}
}

func TestLimitChangeTakesEffect(t *testing.T) {
	big := mustLimit(t, 10, 100)
	small := mustLimit(t, 1, 5)
	b := Full(big, 0)
	if !b.TakeAt(0, small, 5*Micro) {
		t.Fatal("TakeAt(5) under the smaller limit failed: the burst cap should leave 5")
	}
	if b.TakeAt(0, small, Micro) {
		t.Fatal("TakeAt(1) succeeded: shrinking the burst should have capped the bucket at 5")
	}
	if got, want := b.RetryAfter(0, small, Micro), time.Second; got != want {
		t.Errorf("RetryAfter under the new rate = %v, want %v", got, want)
	}
}

// TestRetryAfterExact checks, over random buckets, that RetryAfter names the
// first nanosecond at which TakeAt succeeds.
func TestRetryAfterExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		lim := mustLimit(t, []float64{0.3, 1, 7, 123.456, 1e5}[rng.IntN(5)], 1+rng.Int64N(50))
		b := Full(lim, 0)
		now := time.Duration(0)
		for range rng.IntN(5) {
			now += time.Duration(rng.Int64N(int64(time.Second)))
			b.Charge(now, lim, rng.Int64N(lim.Burst))
		}
		n := 1 + rng.Int64N(lim.Burst)
		w := b.RetryAfter(now, lim, n)
		if w > 0 {
			early := b
			if early.TakeAt(now+w-1, lim, n) {
				t.Fatalf("case %d: TakeAt one ns before RetryAfter (%v) succeeded", i, w)
			}
		}
		if !b.TakeAt(now+w, lim, n) {
			t.Fatalf("case %d: TakeAt at RetryAfter (%v) failed", i, w)
		}
	}
}

// TestDifferentialXRate runs the same sequences of (time, cost) through a
// Bucket and golang.org/x/time/rate and wants the same decisions and the same
// token counts. Times lie on a microsecond grid and rates are such that a
// microsecond adds a multiple of half a micro-token: then the exact value of
// the bucket sits either on a decision boundary or at least half a
// micro-token from it, where x/time/rate's float arithmetic is still right,
// and both must agree exactly.
func TestDifferentialXRate(t *testing.T) {
	rates := []float64{0.5, 1, 2, 2.5, 5, 10, 33, 100}
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.Unix(1_700_000_000, 0)
	for c := range 300 {
		r := rates[rng.IntN(len(rates))]
		burst := 1 + rng.Int64N(40)
		lim := mustLimit(t, r, burst)
		xl := rate.NewLimiter(rate.Limit(r), int(burst))
		b := Full(lim, 0)
		// Mean gap: a cost of 1 every 1/(2r) seconds, so demand is twice the rate.
		meanGap := int64(float64(time.Second) / (2 * r) / float64(time.Microsecond))
		now := time.Duration(0)
		allowed := 0
		for s := range 400 {
			now += time.Duration(rng.Int64N(2*meanGap+1)) * time.Microsecond
			n := int64(1)
			if rng.IntN(4) == 0 {
				n = 1 + rng.Int64N(burst)
			}
			got := b.TakeAt(now, lim, n*Micro)
			want := xl.AllowN(base.Add(now), int(n))
			if got != want {
				t.Fatalf("case %d (rate %v, burst %d), step %d at %v cost %d: bucket says %v, x/time/rate says %v",
					c, r, burst, s, now, n, got, want)
			}
			if got {
				allowed++
			}
			if d := float64(b.Tokens(now, lim))/Micro - xl.TokensAt(base.Add(now)); math.Abs(d) > 1e-6 {
				t.Fatalf("case %d step %d: tokens differ by %g", c, s, d)
			}
		}
		if allowed == 0 {
			t.Fatalf("case %d: nothing allowed; the sequence tests nothing", c)
		}
	}
}

// TestWindowBound is the property the whole limiter rests on: over any window
// of length T, a bucket admits at most B + R*T, whatever the arrivals.
func TestWindowBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for c := range 200 {
		r := 0.5 + rng.Float64()*50
		burst := 1 + rng.Int64N(30)
		lim := mustLimit(t, r, burst)
		rt := float64(lim.Rate) / Micro // the rate as rounded to micro-tokens
		b := Full(lim, 0)
		type admit struct {
			at time.Duration
			n  int64
		}
		var admitted []admit
		now := time.Duration(0)
		for range 300 {
			now += time.Duration(rng.ExpFloat64() / (3 * r) * float64(time.Second))
			n := 1 + rng.Int64N(min(burst, 3))
			if b.TakeAt(now, lim, n*Micro) {
				admitted = append(admitted, admit{now, n})
			}
		}
		for i := range admitted {
			sum := int64(0)
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].n
				window := (admitted[j].at - admitted[i].at).Seconds()
				if bound := float64(burst) + rt*window; float64(sum) > bound+1e-9 {
					t.Fatalf("case %d: admitted %d in a window of %.6fs, more than B+R*T = %.6f", c, sum, window, bound)
				}
			}
		}
	}
}

// TestIdleAdmitsBurst: a bucket idle long enough admits exactly B at once,
// the first time and after it refilled.
func TestIdleAdmitsBurst(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int64
	}{{1, 1}, {5, 10}, {0.1, 3}, {1000, 1000}, {1e6, 7}} {
		lim := mustLimit(t, tc.rate, tc.burst)
		b := Full(lim, 0)
		now := time.Duration(0)
		for round := range 3 {
			for i := range tc.burst {
				if !b.TakeAt(now, lim, Micro) {
					t.Fatalf("%+v round %d: token %d denied", tc, round, i+1)
				}
			}
			if b.TakeAt(now, lim, Micro) {
				t.Fatalf("%+v round %d: token %d allowed, burst is %d", tc, round, tc.burst+1, tc.burst)
			}
			now += b.ResetAfter(now, lim)
		}
	}
}

func TestNewLimitValidation(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int64
	}{
		{math.NaN(), 1}, {math.Inf(1), 1}, {math.Inf(-1), 1}, {0, 1}, {-1, 1}, {1e-9, 1}, {2e9, 1},
		{1, 0}, {1, -1}, {1, 2_000_000_000},
	} {
		if _, err := NewLimit(tc.rate, tc.burst); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("NewLimit(%v, %d) error = %v, want ErrInvalidLimit", tc.rate, tc.burst, err)
		}
	}
	lim := mustLimit(t, 1, 5)
	for _, n := range []int64{0, -1, 6} {
		if _, err := lim.Cost(n); !errors.Is(err, ErrInvalidCost) {
			t.Errorf("Cost(%d) with burst 5: error = %v, want ErrInvalidCost", n, err)
		}
	}
}

// FuzzBucket drives a bucket with arbitrary steps and checks its invariants:
// tokens within [-B, B], time never going back, RetryAfter consistent.
func FuzzBucket(f *testing.F) {
	f.Add(5.0, int64(10), []byte{0, 10, 1, 200, 3})
	f.Add(0.001, int64(1), []byte{255, 255, 0, 1})
	f.Fuzz(func(t *testing.T, r float64, burst int64, prog []byte) {
		lim, err := NewLimit(r, burst)
		if err != nil {
			return
		}
		b := Full(lim, 0)
		now := time.Duration(0)
		for i := 0; i+1 < len(prog); i += 2 {
			now += time.Duration(prog[i]) * time.Duration(prog[i]) * time.Millisecond
			n := int64(prog[i+1])*Micro/7 + 1
			switch prog[i] % 3 {
			case 0:
				b.TakeAt(now, lim, min(n, lim.Burst))
			case 1:
				b.Charge(now, lim, n)
			case 2:
				b.Put(now, lim, n)
			}
			if tok := b.Tokens(now, lim); tok < -lim.Burst || tok > lim.Burst {
				t.Fatalf("tokens %d outside [-%d, %d]", tok, lim.Burst, lim.Burst)
			}
			if b.last != now {
				t.Fatalf("bucket time %v, want %v", b.last, now)
			}
			if w := b.RetryAfter(now, lim, min(n, lim.Burst)); w < 0 {
				t.Fatalf("RetryAfter = %v", w)
			}
		}
	})
}
