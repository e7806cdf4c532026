// Package limit holds what every tier of the limiter agrees on: the units of
// a token bucket, the validation of limits, costs and keys, and the integer
// arithmetic that turns time into micro-tokens and back.
//
// Token counts are integers in micro-tokens (Micro per token) so that the
// in-process buckets and the Lua scripts in Redis compute the same values,
// and every count stays below 2^53, where Lua's doubles are still exact.
package limit

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Micro is the number of micro-tokens in one token.
const Micro = 1_000_000

// Bounds of a valid limit and key.
const (
	// MinRate is the smallest rate, in tokens per second: one micro-token a second.
	MinRate = 1e-6
	// MaxRate is the largest rate, in tokens per second.
	MaxRate = 1e9
	// MaxBurst is the largest burst, in tokens. A bucket may hold -MaxBurst to
	// MaxBurst tokens, which in micro-tokens stays well below 2^53.
	MaxBurst = 1_000_000_000
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
)

// Sentinel errors for misuse. They are reported before any state is touched.
var (
	ErrInvalidLimit = errors.New("invalid limit")
	ErrInvalidCost  = errors.New("invalid cost")
	ErrInvalidKey   = errors.New("invalid key")
)

// Limit is a token-bucket limit in the caller's units: Rate tokens per second
// refill a bucket that holds at most Burst tokens.
type Limit struct {
	Rate  float64 // tokens per second
	Burst int64   // capacity in tokens
}

// MicroLimit is a validated limit in micro-tokens, the form every tier computes
// with. The zero value is not valid; build one with Limit.Micro.
type MicroLimit struct {
	Rate  int64 // micro-tokens per second, >= 1
	Burst int64 // micro-tokens, >= Micro
}

// Micro validates l and converts it to micro-tokens. The rate is rounded to
// the nearest micro-token per second.
func (l Limit) Micro() (MicroLimit, error) {
	if math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate < MinRate || l.Rate > MaxRate {
		return MicroLimit{}, fmt.Errorf("%w: rate %v is outside [%v, %v] tokens/s", ErrInvalidLimit, l.Rate, MinRate, float64(MaxRate))
	}
	if l.Burst < 1 || l.Burst > MaxBurst {
		return MicroLimit{}, fmt.Errorf("%w: burst %d is outside [1, %d]", ErrInvalidLimit, l.Burst, MaxBurst)
	}
	return MicroLimit{Rate: int64(math.Round(l.Rate * Micro)), Burst: l.Burst * Micro}, nil
}

// Cost validates a cost of n tokens against m and returns it in micro-tokens.
// A cost above the burst can never be met: it is an error, not a denial.
func (m MicroLimit) Cost(n int64) (int64, error) {
	if n < 1 || n > m.Burst/Micro {
		return 0, fmt.Errorf("%w: cost %d is outside [1, burst %d]", ErrInvalidCost, n, m.Burst/Micro)
	}
	return n * Micro, nil
}

// CheckKey reports whether key may name a bucket: not empty and at most
// MaxKeyLen bytes. Any bytes are allowed; the tiers encode them.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// Refill returns the micro-tokens that rate micro-tokens per second add over
// elapsed, plus the remainder carried in, as whole micro-tokens and a new
// remainder in micro-token-nanoseconds (below 1e9). Carrying the remainder
// makes a bucket refilled in many small steps hold exactly what one step
// would give. elapsed must not be negative. The sum saturates at MaxInt64.
func Refill(elapsed time.Duration, rate int64, frac int64) (add, rem int64) {
	hi, lo := bits.Mul64(uint64(elapsed), uint64(rate))
	lo, carry := bits.Add64(lo, uint64(frac), 0)
	hi += carry
	if hi >= uint64(time.Second) {
		return math.MaxInt64, 0
	}
	q, r := bits.Div64(hi, lo, uint64(time.Second))
	if q > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(q), int64(r)
}

// DurationFor returns how long rate micro-tokens per second take to add
// deficit micro-tokens, rounded up to the nanosecond: after that long the
// deficit is met. A deficit <= 0 needs no time.
func DurationFor(deficit, rate int64) time.Duration { return Wait(deficit, 0, rate) }

// Wait returns how long rate micro-tokens per second take to add deficit
// micro-tokens to a bucket that already holds rem micro-token-nanoseconds of
// a started micro-token (the remainder Refill returns), rounded up to the
// nanosecond. It is DurationFor made exact for a bucket that carries a
// remainder. A deficit <= 0 needs no time.
func Wait(deficit, rem, rate int64) time.Duration {
	if deficit <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(deficit), uint64(time.Second))
	lo, borrow := bits.Sub64(lo, uint64(rem), 0)
	hi -= borrow
	lo, carry := bits.Add64(lo, uint64(rate-1), 0)
	hi += carry
	if hi >= uint64(rate) {
		return time.Duration(math.MaxInt64)
	}
	q, _ := bits.Div64(hi, lo, uint64(rate))
	if q > math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(q)
}
