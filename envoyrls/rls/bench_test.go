package rls_test

import (
	"context"
	"testing"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// BenchmarkShouldRateLimit measures the handler alone, without gRPC, on
// descriptors the instance holds a lease for: a request of one descriptor,
// and one of three decided together, with a Counters observer.
func BenchmarkShouldRateLimit(b *testing.B) {
	const benchYAML = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`
	var counters rls.Counters
	srv := newServer(b, newLimiter(b), rls.NewRules(load(b, benchYAML)), rls.Config{Observer: &counters})
	ctx := context.Background()
	for _, bb := range []struct {
		name string
		n    int
	}{{"one", 1}, {"three", 3}} {
		r := req("bench", desc("user", "alice"), desc("route", "/api"), desc("tenant", "acme"))
		r.Descriptors = r.Descriptors[:bb.n]
		b.Run(bb.name, func(b *testing.B) {
			if _, err := srv.ShouldRateLimit(ctx, r); err != nil { // the first fetches the leases
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := srv.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
