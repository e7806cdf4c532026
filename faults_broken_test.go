package hybrid_test

import (
	"context"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestFaultBrokenConnection: on a Redis that is up, a call for a request
// whose connection breaks under it (the proxy closes it as the request
// arrives: EOF where the reply is awaited, as on a pooled connection that
// the server or a middlebox closed) is sent again on another connection, in
// every mode: the request is decided by Redis, not by the fallback policy,
// and the breaker stays closed. Two broken in a row (as a Redis that went
// down would break them) hand the request to the fallback policy, as before.
// Before, one broken connection handed its request to the fallback at once.
func TestFaultBrokenConnection(t *testing.T) {
	srv, _ := faultServer(t)
	px := redistest.ProxyTo(t, srv.Addr())
	l := newITInstance(t, px.Addr(), hybrid.Config{}, breaker.Config{}, "broken").lim
	ctx := context.Background()
	if _, err := l.Allow(ctx, "warm", hybrid.Limit{Rate: 100, Burst: 100}); err != nil {
		t.Fatal(err) // the pool holds a connection from now on
	}
	decide := func(key string, lim hybrid.Limit) hybrid.Result {
		t.Helper()
		if lim.Mode == hybrid.Optimistic {
			// A first request is admitted on trust: the second learns
			// the bucket.
			if _, err := l.Allow(ctx, key, lim); err != nil {
				t.Fatal(err)
			}
		}
		res, err := l.Allow(ctx, key, lim)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		lim := hybrid.Limit{Rate: 100, Burst: 100, Mode: mode}
		before := l.Stats()
		key := "broken-once-" + mode.String()
		px.CutOn([]byte(key), 1)
		if res := decide(key, lim); !res.Allowed || res.Source == hybrid.SourceFallback {
			t.Errorf("%v: one broken connection: %+v, want allowed by Redis", mode, res)
		}
		after := l.Stats()
		if got := after.Reconcile.Resent - before.Reconcile.Resent; got != 1 {
			t.Errorf("%v: Resent rose by %d, want 1", mode, got)
		}
		if fb := after.FallbackAllowed + after.FallbackDenied - before.FallbackAllowed - before.FallbackDenied; fb != 0 || after.Degraded {
			t.Errorf("%v: the fallback decided %d (degraded %v) after one broken connection", mode, fb, after.Degraded)
		}
	}

	// Last: the breaker counts the two failures.
	px.CutOn([]byte("broken-twice"), 2)
	if res := decide("broken-twice", hybrid.Limit{Rate: 100, Burst: 100}); res.Source != hybrid.SourceFallback {
		t.Errorf("two broken connections in a row: %+v, want decided by the fallback", res)
	}
}
