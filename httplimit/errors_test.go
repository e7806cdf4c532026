package httplimit_test

// What is answered when a request cannot be decided, or is denied: the
// statuses of errors, a closed Limiter, Retry-After, and the responses a
// Config replaces.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestErrors: what cannot be decided is answered with the status
// ErrorStatus gives and a problem body, never served and never a Redis
// matter; in Shadow mode it is served. Every one is counted. (A request
// whose context ends while it waits for Redis may be decided all the same,
// by a fetch that completes meanwhile: TestErrorStatus covers its 503.)
func TestErrors(t *testing.T) {
	burst3 := hybrid.Limit{Rate: slow, Burst: 3}
	oops := errors.New("oops")
	tests := []struct {
		name string
		cfg  httplimit.Config
		r    *http.Request
		want int
	}{
		{"no API key", httplimit.Config{Limit: burst3, Key: httplimit.ByHeader("X-API-Key")}, request("/", client), 400},
		{"empty key", httplimit.Config{Limit: burst3, Key: constKey("")}, request("/", client), 400},
		{"key function fails", httplimit.Config{Limit: burst3, Key: func(*http.Request) (string, error) { return "", oops }}, request("/", client), 500},
		{"negative cost", httplimit.Config{Limit: burst3, Cost: func(*http.Request) int64 { return -1 }}, request("/", client), 400},
		{"cost above burst", httplimit.Config{Limit: burst3, Cost: func(*http.Request) int64 { return 4 }}, request("/", client), 400},
		{"checks fail", httplimit.Config{Checks: func(*http.Request) ([]hybrid.Check, error) { return nil, oops }}, request("/", client), 500},
		{"checks with an invalid limit", httplimit.Config{Checks: func(*http.Request) ([]hybrid.Check, error) {
			return []hybrid.Check{{Key: "k", Limit: hybrid.Limit{Rate: -1, Burst: 1}}}, nil
		}}, request("/", client), 500},
		{"checks with an empty key", httplimit.Config{Checks: func(*http.Request) ([]hybrid.Check, error) {
			return []hybrid.Check{{Key: "k", Limit: burst3}, {Key: "", Limit: burst3}}, nil
		}}, request("/", client), 400},
		{"checks with a cost above burst", httplimit.Config{Checks: func(*http.Request) ([]hybrid.Check, error) {
			return []hybrid.Check{{Key: "k", Limit: burst3, Cost: 4}}, nil
		}}, request("/", client), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
				mw, h := newMiddleware(t, lim, tt.cfg)
				w := serve(h, tt.r)
				var body struct {
					Status int    `json:"status"`
					Title  string `json:"title"`
				}
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
					t.Errorf("body %q: %v", w.Body, err)
				}
				if w.Code != tt.want || body.Status != tt.want || body.Title != http.StatusText(tt.want) {
					t.Errorf("status %d, body %q; want %d", w.Code, w.Body, tt.want)
				}
				if w.Result().Header.Get("Content-Type") != "application/problem+json" || w.Result().Header.Get("Retry-After") != "" {
					t.Errorf("header %v", w.Result().Header)
				}
				if s := mw.Stats(); s != (httplimit.Stats{Errors: 1}) {
					t.Errorf("Stats() = %+v, want 1 error", s)
				}
				// In Shadow mode the request is served, and counted. A
				// single tier gets a new name, hence new keys: a cold
				// fetch that the first request started may have brought
				// its key a lease meanwhile.
				cfg := tt.cfg
				cfg.Shadow = true
				if cfg.Checks == nil {
					cfg.Name = "shadow"
				}
				mw, h = newMiddleware(t, lim, cfg)
				if w := serve(h, tt.r); w.Code != 200 || w.Body.String() != "ok" {
					t.Errorf("Shadow: status %d, body %q; want served", w.Code, w.Body)
				}
				if s := mw.Stats(); s != (httplimit.Stats{Errors: 1}) {
					t.Errorf("Shadow: Stats() = %+v, want 1 error", s)
				}
			})
		})
	}
}

// TestClosed: a closed Limiter is answered 503.
func TestClosed(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		_, h := newMiddleware(t, lim, httplimit.Config{Limit: hybrid.Limit{Rate: 1, Burst: 1}})
		lim.Close(context.Background())
		if w := serve(h, request("/", client)); w.Code != http.StatusServiceUnavailable || w.Body.String() == "ok" {
			t.Errorf("status %d, body %q; want 503", w.Code, w.Body)
		}
	})
}

// TestRetryAfterSeconds: whole seconds, rounded up, at least 1.
func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 1},
		{0, 1},
		{1, 1},
		{time.Second, 1},
		{time.Second + 1, 2},
		{2500 * time.Millisecond, 3},
		{time.Hour, 3600},
	}
	for _, tt := range tests {
		if got := (httplimit.Denial{RetryAfter: tt.d}).RetryAfterSeconds(); got != tt.want {
			t.Errorf("Denial{RetryAfter: %v}.RetryAfterSeconds() = %d, want %d", tt.d, got, tt.want)
		}
	}
}

// TestErrorStatus: the mapping of errors to statuses, through wrapping.
func TestErrorStatus(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{httplimit.ErrNoKey, 400},
		{hybrid.ErrInvalidKey, 400},
		{hybrid.ErrInvalidCost, 400},
		{hybrid.ErrClosed, 503},
		{context.Canceled, 503},
		{context.DeadlineExceeded, 503},
		{hybrid.ErrInvalidLimit, 500},
		{errors.New("anything"), 500},
	}
	for _, tt := range tests {
		for _, err := range []error{tt.err, errors.Join(errors.New("wrapped"), tt.err)} {
			if got := httplimit.ErrorStatus(err); got != tt.want {
				t.Errorf("ErrorStatus(%v) = %d, want %d", err, got, tt.want)
			}
		}
	}
}

// TestResponses: DenyResponse and ErrorResponse replace the default
// answers; the fields and Retry-After are set before DenyResponse runs.
func TestResponses(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		_, h := newMiddleware(t, lim, httplimit.Config{
			Limit: hybrid.Limit{Rate: slow, Burst: 1},
			Key:   httplimit.ByHeader("X-API-Key"),
			DenyResponse: func(w http.ResponseWriter, r *http.Request, d httplimit.Denial) {
				if w.Header().Get("Retry-After") == "" || w.Header().Get("RateLimit") == "" {
					t.Errorf("DenyResponse: header %v, want Retry-After and RateLimit set", w.Header())
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte("slow down, " + d.Key))
			},
			ErrorResponse: func(w http.ResponseWriter, r *http.Request, err error) {
				if !errors.Is(err, httplimit.ErrNoKey) {
					t.Errorf("ErrorResponse: %v, want ErrNoKey", err)
				}
				w.WriteHeader(http.StatusUnauthorized)
			},
		})
		serve(h, request("/", client, "X-API-Key", "abc"))
		if w := serve(h, request("/", client, "X-API-Key", "abc")); w.Code != 503 || w.Body.String() != "slow down, default:x-api-key:abc" {
			t.Errorf("denied: status %d, body %q", w.Code, w.Body)
		}
		if w := serve(h, request("/", client)); w.Code != 401 {
			t.Errorf("no key: status %d, want 401", w.Code)
		}
	})
}
