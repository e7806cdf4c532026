package grpclimit

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/internal/plural"
)

// Status returns the status a denied call is answered with:
// codes.ResourceExhausted, with the details
//
//   - google.rpc.RetryInfo, whose retry_delay is RetryAfter: how long until
//     the call could pass;
//   - google.rpc.QuotaFailure, with one violation whose subject and
//     quota_id are the tier that denied, whose quota_value is its burst, and
//     whose description says what the call cost and what the tier holds.
//
// Neither the message nor the details hold the bucket key, which may hold
// what the caller identified itself with.
func (d Denial) Status() *status.Status {
	st := status.New(codes.ResourceExhausted,
		fmt.Sprintf("rate limit exceeded: tier %q; retry after %v", d.Tier, d.RetryAfter))
	withDetails, err := st.WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: d.Tier,
			QuotaId: d.Tier,
			Description: fmt.Sprintf("The call costs %s and tier %q holds %d of its %d now; retry after %v.",
				plural.Count(d.Cost, "token"), d.Tier, d.Remaining, d.Limit.Burst, d.RetryAfter),
			QuotaValue: d.Limit.Burst,
		}}},
	)
	if err != nil { // plain messages: cannot happen
		return st
	}
	return withDetails
}

// ErrorStatus returns the status a call is answered with when err kept it
// from being decided:
//
//   - InvalidArgument for a call the limit cannot apply to: no key (ErrNoKey,
//     httplimit.ErrNoKey, hybrid.ErrInvalidKey) or a cost that can never be
//     met (hybrid.ErrInvalidCost: negative, or above the burst);
//   - Unavailable for a closed Limiter (hybrid.ErrClosed);
//   - Canceled and DeadlineExceeded for a call whose context ended while it
//     waited for Redis;
//   - Internal for anything else: an invalid limit from Config.Checks, an
//     error of a KeyFunc or of Config.Checks.
//
// The message says what kind of problem it was, never err's text, which
// may hold keys or internals. A Redis failure is never among them: the
// Limiter answers through its fallback policy instead.
func ErrorStatus(err error) *status.Status {
	switch {
	case errors.Is(err, hybrid.ErrInvalidCost):
		return status.New(codes.InvalidArgument, "The call costs more tokens than its rate limit can ever hold.")
	case errors.Is(err, ErrNoKey), errors.Is(err, httplimit.ErrNoKey), errors.Is(err, hybrid.ErrInvalidKey):
		return status.New(codes.InvalidArgument, "The call carries nothing to apply its rate limit to.")
	case errors.Is(err, hybrid.ErrClosed):
		return status.New(codes.Unavailable, "The rate limiter is not available.")
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "The call ended while its rate limit was decided.")
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "The call's deadline passed while its rate limit was decided.")
	}
	return status.New(codes.Internal, "The rate limit could not be applied.")
}
