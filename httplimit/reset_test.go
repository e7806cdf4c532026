package httplimit_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestReset: Middleware.Reset of a client's key, as the single tier's Key
// returns it ("ip:" and its address) or as a Check names it, makes its
// bucket full again.
func TestReset(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ctx := context.Background()
		limit := hybrid.Limit{Rate: 0.001, Burst: 2}
		single, h := newMiddleware(t, lim, httplimit.Config{Limit: limit})
		checks, hc := newMiddleware(t, lim, httplimit.Config{Checks: func(r *http.Request) ([]hybrid.Check, error) {
			return []hybrid.Check{{Key: "user:" + r.Header.Get("User"), Limit: limit}}, nil
		}})
		for _, tt := range []struct {
			name  string
			h     http.Handler
			r     func() *http.Request
			reset func() error
		}{
			{"single tier", h, func() *http.Request { return request("/", "192.0.2.1:1") }, func() error { return single.Reset(ctx, "ip:192.0.2.1") }},
			{"checks", hc, func() *http.Request { return request("/", "192.0.2.2:1", "User", "ann") }, func() error { return checks.Reset(ctx, "user:ann") }},
		} {
			for i, want := range []int{200, 200, 429} {
				if w := serve(tt.h, tt.r()); w.Code != want {
					t.Fatalf("%s: request %d: %d, want %d", tt.name, i+1, w.Code, want)
				}
			}
			if err := tt.reset(); err != nil {
				t.Fatalf("%s: Reset = %v", tt.name, err)
			}
			for i, want := range []int{200, 200, 429} {
				if w := serve(tt.h, tt.r()); w.Code != want {
					t.Errorf("%s: after Reset, request %d: %d, want %d", tt.name, i+1, w.Code, want)
				}
			}
		}
	})
}
