package policy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/policy"
)

// benchCases are requests against the example rules.
var benchCases = []struct {
	name   string
	method string
	target string
	tenant string
	id     policy.Identity
}{
	{"report", "GET", "/v1/reports/42", "", policy.Identity{Plan: "free", User: "alice", IP: "203.0.113.7"}},
	{"item", "GET", "/v1/items/7", "", policy.Identity{Plan: "free", User: "alice", APIKey: "k-123", IP: "203.0.113.7"}},
	{"no-route", "GET", "/v1/health", "", policy.Identity{Plan: "pro", User: "alice", IP: "203.0.113.7"}},
	{"405", "DELETE", "/v1/items/7", "", policy.Identity{Plan: "pro", User: "alice", IP: "203.0.113.7"}},
	{"tenant", "POST", "/v1/exports/csv", "acme", policy.Identity{Plan: "enterprise", User: "alice", IP: "203.0.113.7"}},
}

func benchRequest(method, target, tenant string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	if tenant != "" {
		r.Header.Set("X-Tenant-ID", tenant)
	}
	return r
}

// BenchmarkChecks measures the checks of one request, a new slice each.
func BenchmarkChecks(b *testing.B) {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range benchCases {
		r := benchRequest(bc.method, bc.target, bc.tenant)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rules.Checks(r, bc.id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendChecks measures the checks of one request into a reused
// slice: what is left is the keys.
func BenchmarkAppendChecks(b *testing.B) {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range benchCases {
		r := benchRequest(bc.method, bc.target, bc.tenant)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]hybrid.Check, 0, 16)
			for b.Loop() {
				var err error
				if dst, err = rules.AppendChecks(dst[:0], r, bc.id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChecksParallel measures Checks from every core at once: the
// rules are shared, read-only.
func BenchmarkChecksParallel(b *testing.B) {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		b.Fatal(err)
	}
	bc := benchCases[0]
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := benchRequest(bc.method, bc.target, bc.tenant)
		for pb.Next() {
			if _, err := rules.Checks(r, bc.id); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
