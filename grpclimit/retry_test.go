package grpclimit_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// denied returns a ResourceExhausted error whose RetryInfo asks for delay.
func denied(delay time.Duration) error {
	return grpclimit.Denial{Tier: "t", Limit: hybrid.Limit{Rate: 1, Burst: 1}, Cost: 1, RetryAfter: delay}.Status().Err()
}

// withDetails returns the error of code with details.
func withDetails(code codes.Code, details ...*errdetails.RetryInfo) error {
	st := status.New(code, "x")
	for _, d := range details {
		st, _ = st.WithDetails(d)
	}
	return st.Err()
}

// TestRetry: the client interceptor on a fake invoker that answers with
// the errors of each case in turn, in a bubble: how many attempts it makes,
// how long it waits in all, and what it returns.
func TestRetry(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name     string
		r        grpclimit.Retry
		timeout  time.Duration // of the call's context; 0: none
		cancel   time.Duration // when the call's context is cancelled; 0: never
		errs     []error       // of the attempts; then nil
		attempts int
		waited   time.Duration
		code     codes.Code
	}{
		{"no error", grpclimit.Retry{}, 0, 0, nil, 1, 0, codes.OK},
		{"retried after the delay", grpclimit.Retry{}, 0, 0, []error{denied(300 * ms)}, 2, 300 * ms, codes.OK},
		{"each delay in turn", grpclimit.Retry{}, 0, 0, []error{denied(300 * ms), denied(200 * ms)}, 3, 500 * ms, codes.OK},
		{"3 attempts by default", grpclimit.Retry{}, 0, 0, []error{denied(ms), denied(ms), denied(ms)}, 3, 2 * ms, codes.ResourceExhausted},
		{"MaxAttempts", grpclimit.Retry{MaxAttempts: 5}, 0, 0, []error{denied(ms), denied(ms), denied(ms), denied(ms), denied(ms)}, 5, 4 * ms, codes.ResourceExhausted},
		{"MaxAttempts -1: no retry", grpclimit.Retry{MaxAttempts: -1}, 0, 0, []error{denied(ms)}, 1, 0, codes.ResourceExhausted},
		{"a delay of 0 retries at once", grpclimit.Retry{}, 0, 0, []error{denied(0)}, 2, 0, codes.OK},
		{"delay at MaxDelay (1s by default)", grpclimit.Retry{}, 0, 0, []error{denied(time.Second)}, 2, time.Second, codes.OK},
		{"delay above MaxDelay (1s by default)", grpclimit.Retry{}, 0, 0, []error{denied(time.Second + 1)}, 1, 0, codes.ResourceExhausted},
		{"delay above MaxDelay", grpclimit.Retry{MaxDelay: 100 * ms}, 0, 0, []error{denied(101 * ms)}, 1, 0, codes.ResourceExhausted},
		{"delay beyond the deadline", grpclimit.Retry{}, 200 * ms, 0, []error{denied(300 * ms)}, 1, 0, codes.ResourceExhausted},
		{"delay within the deadline", grpclimit.Retry{}, 400 * ms, 0, []error{denied(300 * ms)}, 2, 300 * ms, codes.OK},
		{"cancelled while waiting", grpclimit.Retry{}, 0, 100 * ms, []error{denied(300 * ms)}, 1, 100 * ms, codes.Canceled},
		{"not ResourceExhausted", grpclimit.Retry{}, 0, 0, []error{withDetails(codes.Unavailable, &errdetails.RetryInfo{RetryDelay: durationpb.New(ms)})}, 1, 0, codes.Unavailable},
		{"no RetryInfo", grpclimit.Retry{}, 0, 0, []error{withDetails(codes.ResourceExhausted)}, 1, 0, codes.ResourceExhausted},
		{"RetryInfo without a delay", grpclimit.Retry{}, 0, 0, []error{withDetails(codes.ResourceExhausted, &errdetails.RetryInfo{})}, 1, 0, codes.ResourceExhausted},
		{"not a status", grpclimit.Retry{}, 0, 0, []error{errors.New("x")}, 1, 0, codes.Unknown},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			if tt.cancel > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer time.AfterFunc(tt.cancel, cancel).Stop()
			}
			attempts := 0
			invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				attempts++
				if attempts <= len(tt.errs) {
					return tt.errs[attempts-1]
				}
				return nil
			}
			start := time.Now()
			err := tt.r.Unary()(ctx, "/m", nil, nil, nil, invoker)
			waited := time.Since(start)
			if attempts != tt.attempts || waited != tt.waited || status.Code(err) != tt.code {
				t.Errorf("%s: %d attempts, waited %v, returned %v; want %d, %v, %v", tt.name, attempts, waited, err, tt.attempts, tt.waited, tt.code)
			}
		})
	}
}

// TestRetryServed: a client with the interceptor, against a server that
// denies, waits for the delay in the RetryInfo and its retry passes; a
// client whose context is cancelled while it waits returns at once.
func TestRetryServed(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		var delays []time.Duration
		ic := newInterceptor(t, lim, grpclimit.Config{
			Limit:    hybrid.Limit{Rate: 2, Burst: 1}, // a token every 500ms
			OnDenied: func(_ context.Context, d grpclimit.Denial) { delays = append(delays, d.RetryAfter) },
		})
		s := serve(t, ic, options{client: []grpc.DialOption{grpc.WithUnaryInterceptor(grpclimit.Retry{}.Unary())}})
		if _, _, err := s.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		if _, _, err := s.check(context.Background()); err != nil {
			t.Fatalf("retried call: %v", err)
		}
		if waited := time.Since(start); len(delays) != 1 || delays[0] != 400*time.Millisecond || waited != delays[0] {
			t.Errorf("denials with delays %v, waited %v; want one of 400ms, waited for", delays, waited)
		}
		if got, want := ic.Stats(), (grpclimit.Stats{Allowed: 2, Denied: 1}); got != want {
			t.Errorf("Stats() = %+v, want %+v", got, want)
		}

		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start = time.Now()
		if _, _, err := s.check(ctx); status.Code(err) != codes.Canceled || time.Since(start) != 100*time.Millisecond {
			t.Errorf("call cancelled while waiting: %v after %v, want Canceled after 100ms", err, time.Since(start))
		}
		if len(delays) != 2 || s.served.Load() != 2 {
			t.Errorf("%d denials, %d calls served; want 2, 2", len(delays), s.served.Load())
		}
	})
}

// TestRetryDelay: the delay of a denial's status, and of nothing else.
func TestRetryDelay(t *testing.T) {
	tests := []struct {
		err   error
		delay time.Duration
		ok    bool
	}{
		{denied(1500 * time.Millisecond), 1500 * time.Millisecond, true},
		{denied(-time.Second), 0, true},
		{withDetails(codes.ResourceExhausted, &errdetails.RetryInfo{RetryDelay: &durationpb.Duration{Seconds: 1, Nanos: -1}}), 0, false},
		{withDetails(codes.ResourceExhausted), 0, false},
		{withDetails(codes.Unavailable, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}), 0, false},
		{errors.New("x"), 0, false},
		{nil, 0, false},
	}
	for _, tt := range tests {
		if delay, ok := grpclimit.RetryDelay(tt.err); delay != tt.delay || ok != tt.ok {
			t.Errorf("RetryDelay(%v) = %v, %v; want %v, %v", tt.err, delay, ok, tt.delay, tt.ok)
		}
	}
}
