package local

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// The fuzz targets of this package (FuzzBucket in bucket_test.go and
// FuzzBucketExact here) have committed seed corpora in testdata/fuzz;
// `go test` runs those seeds, and `go test -fuzz` explores from them.

// fuzzStep returns the time step that the byte pair (unit, v) encodes: v
// nanoseconds, microseconds, milliseconds, seconds or hours, so that a
// program reaches both sub-micro-token refills and refills of a whole burst.
func fuzzStep(unit, v byte) time.Duration {
	units := [...]time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond, time.Second, time.Hour}
	return time.Duration(v) * units[int(unit)%len(units)]
}

// FuzzBucketExact checks what Bucket promises to the nanosecond and the
// micro-token, for any limit and any program of takes, charges and waits,
// from a full bucket at time 0:
//
//   - refilling in many steps gives exactly what one step gives;
//   - RetryAfter is exact: TakeAt(now+RetryAfter) succeeds and TakeAt one
//     nanosecond earlier does not;
//   - what TakeAt admits up to any time T is at most B + R*T.
func FuzzBucketExact(f *testing.F) {
	f.Fuzz(func(t *testing.T, rate float64, burst int64, prog []byte) {
		lim, err := NewLimit(rate, burst)
		if err != nil {
			return
		}
		b := Full(lim, 0)
		now := time.Duration(0)
		admitted := int64(0) // micro-tokens taken by TakeAt
		for i := 0; i+2 < len(prog); i += 3 {
			op, x, y := prog[i], prog[i+1], prog[i+2]
			dt := fuzzStep(op>>3, x)
			if now > math.MaxInt64/4-dt {
				return // far beyond any real clock
			}
			n := 1 + int64(y)*(lim.Burst-1)/255 // micro-tokens in [1, burst]
			switch op % 4 {
			case 0:
				now += dt
				if b.TakeAt(now, lim, n) {
					admitted += n
				}
			case 1:
				now += dt
				b.Charge(now, lim, n)
			case 2: // three steps against one
				split, whole := b, b
				for k := range 3 {
					split.Advance(now+dt*time.Duration(k+1)/3, lim)
				}
				whole.Advance(now+dt, lim)
				if split != whole {
					t.Fatalf("%v refilled from %+v to %v: in three steps %+v, in one %+v", lim, b, now+dt, split, whole)
				}
				b = whole
				now += dt
			case 3:
				w := b.RetryAfter(now, lim, n)
				if w < 0 {
					t.Fatalf("%v, bucket %+v: RetryAfter(%v, %d) = %v", lim, b, now, n, w)
				}
				if w == math.MaxInt64 || now > math.MaxInt64-w {
					continue // saturated: the tokens come after the end of time
				}
				at := b
				if !at.TakeAt(now+w, lim, n) {
					t.Fatalf("%v, bucket %+v: RetryAfter(%v, %d) = %v, but TakeAt then fails", lim, b, now, n, w)
				}
				if before := b; w > 0 && before.TakeAt(now+w-1, lim, n) {
					t.Fatalf("%v, bucket %+v: RetryAfter(%v, %d) = %v, but TakeAt 1ns earlier succeeds", lim, b, now, n, w)
				}
			}
			if tok := b.Tokens(now, lim); tok < -lim.Burst || tok > lim.Burst {
				t.Fatalf("%v: tokens %d outside [-B, B] at %v", lim, tok, now)
			}
			// admitted <= B + R*T, in micro-token-nanoseconds, exactly.
			bound := new(big.Int).Mul(big.NewInt(lim.Rate), big.NewInt(int64(now)))
			bound.Add(bound, new(big.Int).Mul(big.NewInt(lim.Burst), big.NewInt(int64(time.Second))))
			got := new(big.Int).Mul(big.NewInt(admitted), big.NewInt(int64(time.Second)))
			if got.Cmp(bound) > 0 {
				t.Fatalf("%v: admitted %d micro-tokens by %v, more than B + R*T", lim, admitted, now)
			}
		}
	})
}
