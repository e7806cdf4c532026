package local

import (
	"testing"

	"github.com/hybridlimit/hybrid/internal/parallel"
)

// BenchmarkSpendShared: one allowance spent from every processor at once,
// through SpendLeft (one word) and SpendLeftShared (striped once
// contended). b.N is split over GOMAXPROCS goroutines of its own, not
// RunParallel's, whose per-goroutine state can share a cache line.
func BenchmarkSpendShared(b *testing.B) {
	for _, shared := range []bool{false, true} {
		name := "word"
		if shared {
			name = "striped"
		}
		b.Run(name, func(b *testing.B) {
			var a Allowance
			a.Add(MaxAllowance)
			parallel.Run(b, func(_, iters int) {
				for range iters {
					var ok bool
					if shared {
						_, ok = a.SpendLeftShared(1)
					} else {
						_, ok = a.SpendLeft(1)
					}
					if !ok {
						a.Add(1 << 40)
					}
				}
			})
		})
	}
}
