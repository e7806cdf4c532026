package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// sink is a ResponseWriter that discards the response and keeps its header
// map, cleared between requests: the benchmarks measure the middleware, not
// the recorder.
type sink struct {
	h    http.Header
	code int
}

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(b []byte) (int, error) { return len(b), nil }
func (s *sink) WriteHeader(code int)        { s.code = code }

// nop is the handler behind the middleware in the benchmarks.
var nop = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// benchLimiter returns a Limiter on miniredis, closed when b ends. Its
// instance may hold the whole burst of a key, so that a benchmark measures
// the decisions made from the lease rather than the round trips that top
// it up.
func benchLimiter(b *testing.B) *hybrid.Limiter {
	m := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	lim, err := hybrid.New(rdb, hybrid.Config{LocalCapacity: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		lim.Close(context.Background())
		rdb.Close()
	})
	return lim
}

// warmup is the number of requests a benchmark makes before it measures.
const warmup = 100_000

// huge is a limit that never denies within a benchmark.
var huge = hybrid.Limit{Rate: 1e9, Burst: 1e9}

// BenchmarkAllowed: one allowed request through the middleware, for a key
// this instance holds a lease for, against the bare handler, and against the
// Limiter's decision alone.
func BenchmarkAllowed(b *testing.B) {
	lim := benchLimiter(b)
	three := []hybrid.Check{
		{Tier: "plan", Key: "plan:acme", Limit: huge},
		{Tier: "user", Key: "user:42", Limit: huge},
		{Tier: "endpoint", Key: "endpoint:/items", Limit: huge},
	}
	cases := []struct {
		name string
		cfg  *httplimit.Config // nil: the bare handler
	}{
		{"bare handler", nil},
		{"client IP, all headers", &httplimit.Config{Name: "a", Limit: huge}},
		{"client IP, IETF headers", &httplimit.Config{Name: "b", Limit: huge, Headers: httplimit.IETFHeaders}},
		{"client IP, no headers", &httplimit.Config{Name: "c", Limit: huge, Headers: httplimit.NoHeaders}},
		{"API key, all headers", &httplimit.Config{Name: "d", Limit: huge, Key: httplimit.ByHeader("X-API-Key")}},
		{"3 tiers, all headers", &httplimit.Config{Checks: func(*http.Request) ([]hybrid.Check, error) { return three, nil }}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := http.Handler(nop)
			if c.cfg != nil {
				mw, err := httplimit.New(lim, *c.cfg)
				if err != nil {
					b.Fatal(err)
				}
				h = mw.Handler(nop)
			}
			r := httptest.NewRequest("GET", "/items", nil)
			r.RemoteAddr = "198.51.100.7:1234"
			r.Header.Set("X-API-Key", "k-0123456789")
			w := &sink{h: http.Header{}}
			// Warm up: the first request fetches a lease, and the lease
			// grows with the rate at which the key is used.
			for range warmup {
				h.ServeHTTP(w, r)
			}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
			if w.code != 0 {
				b.Fatalf("status %d", w.code)
			}
		})
	}
	b.Run("Limiter.AllowAll alone", func(b *testing.B) {
		ctx := context.Background()
		check := hybrid.Check{Tier: "default", Key: "alone", Limit: huge}
		for range warmup {
			lim.AllowAll(ctx, check)
		}
		b.ReportAllocs()
		for b.Loop() {
			if d, err := lim.AllowAll(ctx, check); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
}

// BenchmarkAllowedParallel: allowed requests for one key from every core.
func BenchmarkAllowedParallel(b *testing.B) {
	lim := benchLimiter(b)
	mw, err := httplimit.New(lim, httplimit.Config{Limit: huge})
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Handler(nop)
	r := httptest.NewRequest("GET", "/items", nil)
	r.RemoteAddr = "198.51.100.7:1234"
	w := &sink{h: http.Header{}}
	for range warmup {
		h.ServeHTTP(w, r)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest("GET", "/items", nil)
		r.RemoteAddr = "198.51.100.7:1234"
		w := &sink{h: http.Header{}}
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
		}
		if w.code != 0 {
			b.Errorf("status %d", w.code)
		}
	})
}
