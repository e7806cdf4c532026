package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// TestOnDenied: OnDenied gets every denial, with the call's context, before
// the call is answered and with no lock held (it reads the Stats).
func TestOnDenied(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		var denials []grpclimit.Denial
		var ic *grpclimit.Interceptor
		lm := hybrid.Limit{Rate: 0.25, Burst: 1} // a token every 4 s
		ic = newInterceptor(t, lim, grpclimit.Config{
			Name:  "per-ip",
			Limit: lm,
			Cost:  func(context.Context, string) int64 { return 0 }, // 0 means 1
			OnDenied: func(ctx context.Context, d grpclimit.Denial) {
				if s := ic.Stats(); s.Denied != uint64(len(denials))+1 {
					t.Errorf("OnDenied: Stats().Denied = %d, want %d", s.Denied, len(denials)+1)
				}
				if p, ok := peer.FromContext(ctx); !ok || p.Addr.String() != client {
					t.Errorf("OnDenied: the context's peer is %v, want %s", p, client)
				}
				if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-trace")) != 1 {
					t.Errorf("OnDenied: the context's metadata %v has no x-trace", md)
				}
				denials = append(denials, d)
			},
		})
		s := serve(t, ic, options{peer: tcpAddr(client)})
		if _, _, err := s.check(context.Background(), "x-trace", "1"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		_, _, err := s.check(context.Background(), "x-trace", "2")
		if _, err := s.watch(t, "x-trace", "3"); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("Watch: %v, want ResourceExhausted", err)
		}
		want := grpclimit.Denial{
			Method:     "/grpc.health.v1.Health/Check",
			Tier:       "per-ip",
			Key:        "per-ip:ip:198.51.100.7",
			Limit:      lm,
			Cost:       1,
			Remaining:  0,
			RetryAfter: 3 * time.Second,
		}
		if len(denials) != 2 || denials[0] != want {
			t.Fatalf("denials %+v, want two, the first %+v", denials, want)
		}
		if ri, _ := details(t, err); ri.GetRetryDelay().AsDuration() != denials[0].RetryAfter {
			t.Errorf("RetryInfo delay %v, want the denial's RetryAfter %v", ri.GetRetryDelay().AsDuration(), denials[0].RetryAfter)
		}
		if d := denials[1]; d.Method != "/grpc.health.v1.Health/Watch" || d.Shadow {
			t.Errorf("the stream's denial %+v, want method Watch, not shadow", d)
		}
	})
}

// TestShadow: Shadow mode decides and counts every call, reports denials
// to OnDenied, sends no metadata, but serves every call, errors included;
// ShadowHeaders sends the metadata.
func TestShadow(t *testing.T) {
	for _, withHeaders := range []bool{false, true} {
		inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
			var denials []grpclimit.Denial
			ic := newInterceptor(t, lim, grpclimit.Config{
				Key:           grpclimit.ByMetadata("x-api-key"),
				Limit:         hybrid.Limit{Rate: slow, Burst: 2},
				Shadow:        true,
				ShadowHeaders: withHeaders,
				OnDenied:      func(_ context.Context, d grpclimit.Denial) { denials = append(denials, d) },
			})
			s := serve(t, ic, options{})
			for i := range 4 {
				header, trailer, err := s.check(context.Background(), "x-api-key", "k1")
				if err != nil {
					t.Errorf("call %d: %v, want it served", i, err)
				}
				if got := len(header.Get("ratelimit")) == 1 && len(header.Get("ratelimit-policy")) == 1; got != withHeaders {
					t.Errorf("ShadowHeaders %v, call %d: header %v", withHeaders, i, header)
				}
				if len(trailer.Get("grpc-retry-pushback-ms")) != 0 {
					t.Errorf("call %d: a pushback trailer in Shadow mode", i)
				}
			}
			if _, err := s.watch(t, "x-api-key", "k1"); err != nil {
				t.Errorf("Watch: %v, want it served", err)
			}
			if _, _, err := s.check(context.Background()); err != nil { // no key: an error, served
				t.Errorf("call without a key: %v, want it served", err)
			}
			if got, want := ic.Stats(), (grpclimit.Stats{Allowed: 2, ShadowDenied: 3, Errors: 1}); got != want {
				t.Errorf("Stats() = %+v, want %+v", got, want)
			}
			if len(denials) != 3 || !denials[0].Shadow || denials[0].Key != "default:x-api-key:k1" {
				t.Errorf("denials %+v, want 3 shadow denials of default:x-api-key:k1", denials)
			}
			if got := s.served.Load(); got != 6 {
				t.Errorf("the handler ran %d times, want 6", got)
			}
		})
	}
}
