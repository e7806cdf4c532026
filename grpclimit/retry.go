package grpclimit

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Retry is how a client retries the calls that a server rate-limits: a
// call answered ResourceExhausted with a google.rpc.RetryInfo (as the
// server interceptors answer a denial, before the handler runs, so that the
// call was not served) is made again once the delay it asks for has
// passed. The zero Retry makes up to 3 attempts and waits up to a second.
// A Retry is a value; Unary returns its interceptor.
type Retry struct {
	// MaxAttempts bounds the attempts of a call, the first one included.
	// 0 means 3; a negative value means 1: no retry.
	MaxAttempts int
	// MaxDelay bounds the delay waited before a retry: a denial that asks
	// for longer is returned at once, as is one whose delay would outlast
	// the call's deadline. 0 means 1s.
	MaxDelay time.Duration
}

// Defaults of Retry.
const (
	defaultAttempts = 3
	defaultMaxDelay = time.Second
)

// Unary returns a unary client interceptor that retries as r says. It
// returns the last attempt's error when it does not retry: an error that
// is not ResourceExhausted or has no RetryInfo, a delay above MaxDelay or
// beyond the deadline, or the last attempt. When the call's context ends
// while it waits, it returns at once with the status of the context's
// error (Canceled or DeadlineExceeded).
func (r Retry) Unary() grpc.UnaryClientInterceptor {
	attempts := r.MaxAttempts
	switch {
	case attempts == 0:
		attempts = defaultAttempts
	case attempts < 0:
		attempts = 1
	}
	maxDelay := r.MaxDelay
	if maxDelay <= 0 {
		maxDelay = defaultMaxDelay
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for n := 1; ; n++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || n >= attempts {
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok || delay > maxDelay {
				return err
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
				return err
			}
			if err := sleep(ctx, delay); err != nil {
				return status.FromContextError(err).Err()
			}
		}
	}
}

// sleep waits for d, or until ctx ends: then it returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RetryDelay returns the delay that err asks a client to wait before it
// calls again: the retry_delay of the google.rpc.RetryInfo of a
// ResourceExhausted status, as the server interceptors send with a denial.
// ok is false for any other error, and for a delay that is missing or not
// valid. A negative delay is 0.
func RetryDelay(err error) (delay time.Duration, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, isRetry := d.(*errdetails.RetryInfo); isRetry {
			if ri.GetRetryDelay() == nil || ri.GetRetryDelay().CheckValid() != nil {
				return 0, false
			}
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
