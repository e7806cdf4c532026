package grpclimit_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// TestReset: Interceptor.Reset of a caller's key, as the single tier's Key
// returns it ("ip:" and its address), makes its bucket full again.
func TestReset(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Limit: hybrid.Limit{Rate: 0.001, Burst: 2}})
		s := serve(t, ic, options{peer: tcpAddr(client)})
		calls := func(when string) {
			t.Helper()
			for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
				if _, _, err := s.check(context.Background()); status.Code(err) != want {
					t.Errorf("%s: call %d: %v, want %v", when, i+1, err, want)
				}
			}
		}
		calls("before")
		if err := ic.Reset(context.Background(), "ip:198.51.100.7"); err != nil { // ByPeer's key of client
			t.Fatalf("Reset = %v", err)
		}
		calls("after Reset")
	})
}
