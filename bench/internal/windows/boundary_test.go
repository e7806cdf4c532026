package windows

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/hybridlimit/hybrid/global"
)

// The boundary figures: a limit of boundL per boundT; the token buckets
// refill boundL per boundT (R = L/T) and hold a burst of boundL, as
// redis_rate.PerSecond sets its burst, or a tenth of it.
const (
	boundL    = 100
	boundT    = time.Second
	boundTick = 10 * time.Millisecond // a greedy client asks at every tick
	boundSpan = 2 * boundT            // for this long
	boundNear = 2 * boundTick         // "at once": any interval this long
)

// boundPhases are where in a window the greedy client starts, idle before.
var boundPhases = []time.Duration{0, 500 * time.Millisecond, 990 * time.Millisecond}

// asker asks for one token of a key at the fake Redis's time.
type asker func(ctx context.Context) (bool, error)

// boundContender is an algorithm under the boundary test, and what it
// admits at most, as measured: in any interval of boundT, and of
// boundNear.
type boundContender struct {
	name       string
	make       func(f *fakeRedis) (asker, error)
	inT, atNow int
}

// windowAsker asks a window script.
func windowAsker(alg Algorithm) func(f *fakeRedis) (asker, error) {
	return func(f *fakeRedis) (asker, error) {
		l, err := New(f.rdb, alg)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) (bool, error) {
			res, err := l.Allow(ctx, "k", Limit{boundL, boundT}, 1)
			return res.Allowed, err
		}, nil
	}
}

// bucketAsker asks hybrid's token bucket through global.Limiter.Allow:
// the script call that Exact mode makes for each decision.
func bucketAsker(burst int64) func(f *fakeRedis) (asker, error) {
	return func(f *fakeRedis) (asker, error) {
		g, err := global.New(f.rdb, global.Config{})
		if err != nil {
			return nil, err
		}
		lim := global.Limit{Rate: boundL / boundT.Seconds(), Burst: burst}
		return func(ctx context.Context) (bool, error) {
			res, err := g.Allow(ctx, "k", lim, 1)
			return res.Allowed, err
		}, nil
	}
}

// gcraAsker asks go-redis/redis_rate.
func gcraAsker(f *fakeRedis) (asker, error) {
	l := redis_rate.NewLimiter(f.rdb)
	lim := redis_rate.Limit{Rate: boundL, Burst: boundL, Period: boundT}
	return func(ctx context.Context) (bool, error) {
		res, err := l.Allow(ctx, "k", lim)
		if err != nil {
			return false, err
		}
		return res.Allowed > 0, nil
	}, nil
}

// boundContenders are the algorithms compared, with what they admit.
var boundContenders = []boundContender{
	{"fixed window", windowAsker(FixedWindow), 200, 200},
	{"sliding log", windowAsker(SlidingLog), 100, 100},
	{"sliding-window counter", windowAsker(SlidingCounter), 198, 100},
	{"token bucket (hybrid, B=L)", bucketAsker(boundL), 199, 101},
	{"token bucket (hybrid, B=L/10)", bucketAsker(boundL / 10), 109, 11},
	{"GCRA (redis_rate, burst L)", gcraAsker, 199, 101},
}

// greedy runs a client that, from start for span, asks at every tick until
// it is denied, and returns the times of its admissions, one a token.
func greedy(ctx context.Context, f *fakeRedis, ask asker, start time.Duration) ([]time.Duration, error) {
	var admitted []time.Duration
	for at := start; at < start+boundSpan; at += boundTick {
		f.set(at)
		for range 4 * boundL { // a bound, never reached
			ok, err := ask(ctx)
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
			admitted = append(admitted, at)
		}
	}
	return admitted, nil
}

// most returns the most of the sorted times that lie in one interval
// [s, s+d).
func most(times []time.Duration, d time.Duration) int {
	best, lo := 0, 0
	for hi, t := range times {
		for times[lo] <= t-d {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// TestBoundaryBurst measures the burst each algorithm admits around a
// window boundary, on the scripts themselves (miniredis, whose clock the
// test sets): a greedy client, idle before, starts at one of boundPhases
// into a window and asks at every boundTick for boundSpan, as many tokens
// as it is given; the figures are the most admitted in any interval of
// boundT and of boundNear, over the phases. docs/windows.md quotes the
// table it logs (go test -run TestBoundaryBurst -v ./bench/internal/windows).
func TestBoundaryBurst(t *testing.T) {
	type found struct {
		inT, atNow int
		from       []time.Duration // the phases of inT
	}
	got := make([]found, len(boundContenders))
	t.Run("algorithms", func(t *testing.T) {
		for i, c := range boundContenders {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				for _, phase := range boundPhases {
					f := newFakeRedis(t)
					ask, err := c.make(f)
					if err != nil {
						t.Fatal(err)
					}
					admitted, err := greedy(context.Background(), f, ask, phase)
					if err != nil {
						t.Fatalf("from %v: %v", phase, err)
					}
					g := &got[i]
					switch n := most(admitted, boundT); {
					case n > g.inT:
						g.inT, g.from = n, []time.Duration{phase}
					case n == g.inT:
						g.from = append(g.from, phase)
					}
					g.atNow = max(g.atNow, most(admitted, boundNear))
				}
				if g := got[i]; g.inT != c.inT || g.atNow != c.atNow {
					t.Errorf("the most in any %v, %v = %d, %d; want %d, %d", boundT, boundNear, g.inT, g.atNow, c.inT, c.atNow)
				}
			})
		}
	})
	var b strings.Builder
	fmt.Fprintf(&b, "limit L=%d per T=%v (token buckets: R=L/T, burst B); a greedy client from idle, asking at every %v for %v from %v into a window\n",
		boundL, boundT, boundTick, boundSpan, boundPhases)
	fmt.Fprintf(&b, "%-30s  %14s  %16s  %s\n", "algorithm", "most in any "+boundT.String(), "most in any "+boundNear.String(), "from")
	for i, c := range boundContenders {
		fmt.Fprintf(&b, "%-30s  %14d  %16d  %v\n", c.name, got[i].inT, got[i].atNow, got[i].from)
	}
	t.Log("\n" + b.String())
}

// TestMost: the most times in one interval [s, s+d).
func TestMost(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		times []time.Duration
		d     time.Duration
		want  int
	}{
		{nil, ms, 0},
		{[]time.Duration{0, 0, 0}, ms, 3},
		{[]time.Duration{0, ms, 2 * ms}, ms, 1},
		{[]time.Duration{0, ms, 2 * ms}, 2 * ms, 2},
		{[]time.Duration{0, 5 * ms, 5 * ms, 6 * ms, 10 * ms, 11 * ms}, 5 * ms, 3},
	}
	for _, tt := range tests {
		if got := most(tt.times, tt.d); got != tt.want {
			t.Errorf("most(%v, %v) = %d, want %d", tt.times, tt.d, got, tt.want)
		}
	}
	if !slices.IsSorted(boundPhases) {
		t.Error("boundPhases not sorted")
	}
}
