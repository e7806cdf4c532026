package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// subBits is log2 of the buckets per power of two: 16 of them, so a value
// is known to within 1/16 (6.25%) of itself, and values below 32 ns exactly.
const subBits = 4

// nBuckets covers every non-negative int64.
const nBuckets = (64 - subBits) << subBits

// Histogram counts durations in log-linear buckets: each power of two is
// split into 16 equal buckets. The zero value is empty and ready to use. It
// is not safe for concurrent use: give each goroutine its own and Merge
// them.
type Histogram struct {
	counts [nBuckets]uint64
	n      uint64
	max    time.Duration
}

// bucketOf returns the bucket of v >= 0.
func bucketOf(v int64) int {
	if v < 1<<subBits {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - 1 - subBits
	return (shift+1)<<subBits + int(v>>shift&(1<<subBits-1))
}

// upper returns the largest value that falls in bucket i.
func upper(i int) int64 {
	if i < 1<<subBits {
		return int64(i)
	}
	shift := i>>subBits - 1
	low := int64(1<<subBits+i&(1<<subBits-1)) << shift
	return low + (int64(1)<<shift - 1)
}

// Record counts d. A negative d counts as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucketOf(int64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// Merge adds the counts of o to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count returns the number of durations recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest duration recorded, exactly.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns the q-quantile (0 < q <= 1) of the recorded durations:
// the smallest bucket bound that at least q of them do not exceed, never
// above Max. It is at least the exact quantile and exceeds it by less than
// 1/16 of it. An empty Histogram returns 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return min(time.Duration(upper(i)), h.max)
		}
	}
	return h.max
}

// histogramJSON is a Histogram as JSON: its non-empty buckets as
// [index, count] pairs.
type histogramJSON struct {
	N       uint64      `json:"n"`
	Max     int64       `json:"max_ns"`
	Buckets [][2]uint64 `json:"buckets"`
}

// MarshalJSON encodes h with its non-empty buckets only.
func (h Histogram) MarshalJSON() ([]byte, error) {
	j := histogramJSON{N: h.n, Max: int64(h.max), Buckets: [][2]uint64{}}
	for i, c := range h.counts {
		if c > 0 {
			j.Buckets = append(j.Buckets, [2]uint64{uint64(i), c})
		}
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON encoded into h.
func (h *Histogram) UnmarshalJSON(b []byte) error {
	var j histogramJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = Histogram{n: j.N, max: time.Duration(j.Max)}
	var sum uint64
	for _, bc := range j.Buckets {
		if bc[0] >= nBuckets {
			return fmt.Errorf("bench: histogram bucket %d out of range", bc[0])
		}
		h.counts[bc[0]] += bc[1]
		sum += bc[1]
	}
	if sum != h.n {
		return fmt.Errorf("bench: histogram counts %d values in its buckets, %d in all", sum, h.n)
	}
	return nil
}
