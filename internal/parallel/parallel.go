// Package parallel runs a benchmark's iterations from every processor, for
// the benchmarks of the module's packages.
package parallel

import (
	"runtime"
	"sync"
	"testing"
)

// Run runs body on GOMAXPROCS goroutines, the w-th for iters of b.N's
// iterations, and times them together, as b.RunParallel does but with
// nothing shared between the goroutines: RunParallel's testing.PB values
// are small neighbours on the heap, each Next writes to its own, and so they
// share a cache line that every iteration moves between the cores (a quarter
// of the time of a hot key's decisions in a CPU profile).
func Run(b *testing.B, body func(w, iters int)) {
	procs := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range procs {
		iters := b.N / procs
		if w < b.N%procs {
			iters++
		}
		wg.Go(func() { body(w, iters) })
	}
	wg.Wait()
}
