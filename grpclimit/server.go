package grpclimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// The metadata keys of the rate-limit fields, and of the pushback trailer
// of gRPC's retry design (gRFC A6).
const (
	mdPolicy    = "ratelimit-policy"
	mdRateLimit = "ratelimit"
	mdPushback  = "grpc-retry-pushback-ms"
)

// Unary returns the unary server interceptor: it decides each call before
// its handler runs, and answers a denied one with Denial.Status, or a call
// that could not be decided with ErrorStatus.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var hs headerSetter
		if s := grpc.ServerTransportStreamFromContext(ctx); s != nil {
			hs = s
		}
		trailer, err := ic.admit(ctx, info.FullMethod, hs)
		if err != nil {
			if trailer != nil {
				grpc.SetTrailer(ctx, trailer)
			}
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: it decides each stream
// once, when it starts, with the header metadata set on the stream before
// its handler runs, and answers a denied one as Unary does.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		trailer, err := ic.admit(ss.Context(), info.FullMethod, ss)
		if err != nil {
			if trailer != nil {
				ss.SetTrailer(trailer)
			}
			return err
		}
		return handler(srv, ss)
	}
}

// headerSetter is where the header metadata of a call is set: its
// grpc.ServerTransportStream, or its grpc.ServerStream.
type headerSetter interface {
	SetHeader(metadata.MD) error
}

// admit decides the call of method with context ctx, and sets its
// rate-limit metadata on hs (if not nil). err is nil if the call is to be
// served; else it is the status to answer with, and trailer, for a denial,
// the trailer metadata to send with it.
func (ic *Interceptor) admit(ctx context.Context, method string, hs headerSetter) (trailer metadata.MD, err error) {
	var arrived time.Time // for MaxWait, which counts from here
	if ic.maxWait > 0 {
		arrived = time.Now()
	}
	var one [1]hybrid.Check
	checks, err := ic.checksFor(ctx, method, one[:0])
	if err != nil {
		return nil, ic.fail(err)
	}
	if len(checks) == 0 {
		ic.shard().exempt.Add(1)
		return nil, nil
	}
	d, err := ic.lim.AllowAll(ctx, checks...)
	if err != nil {
		return nil, ic.fail(err)
	}
	if ic.headers && hs != nil {
		hs.SetHeader(ic.header(checks, &d))
	}
	if d.Allowed {
		ic.shard().allowed.Add(1)
		return nil, nil
	}
	if !ic.shadow && ic.maxWait > 0 && d.Result().RetryAfter <= ic.maxWait {
		wctx, cancel := context.WithDeadline(ctx, arrived.Add(ic.maxWait))
		err := ic.lim.WaitAll(wctx, checks...)
		cancel()
		switch {
		case err == nil:
			sh := ic.shard()
			sh.allowed.Add(1)
			sh.waited.Add(1)
			return nil, nil
		case ctx.Err() != nil:
			return nil, ic.fail(err) // the caller gave up: no denial to tell
		}
	}
	den := denial(method, checks, &d, ic.shadow)
	if ic.shadow {
		ic.shard().shadowDenied.Add(1)
		if ic.onDenied != nil {
			ic.onDenied(ctx, den)
		}
		return nil, nil
	}
	ic.shard().denied.Add(1)
	if ic.onDenied != nil {
		ic.onDenied(ctx, den)
	}
	ms := max((den.RetryAfter+time.Millisecond-1)/time.Millisecond, 1) // rounded up
	return metadata.MD{mdPushback: {strconv.FormatInt(int64(ms), 10)}}, den.Status().Err()
}

// checksFor returns the checks of the call, appended to buf for the single
// tier, with the keys the Limiter is asked about.
func (ic *Interceptor) checksFor(ctx context.Context, method string, buf []hybrid.Check) ([]hybrid.Check, error) {
	if ic.checks == nil {
		key, err := ic.key(ctx, method)
		if err != nil {
			return nil, fmt.Errorf("grpclimit: tier %q: %w", ic.name, err)
		}
		if key == "" {
			return nil, fmt.Errorf("grpclimit: tier %q: %w", ic.name, ErrNoKey)
		}
		if key, err = httplimit.BucketKey(ic.keyPrefix + key); err != nil {
			return nil, err
		}
		var cost int64 = 1
		if ic.cost != nil {
			if cost = ic.cost(ctx, method); cost == 0 {
				cost = 1
			}
		}
		return append(buf, hybrid.Check{Tier: ic.name, Key: key, Limit: ic.limit, Cost: cost}), nil
	}
	checks, err := ic.checks(ctx, method)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: checks: %w", err)
	}
	checks, err = httplimit.PrepareChecks(checks)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: %w", err)
	}
	return checks, nil
}

// header returns the rate-limit header metadata of decision d on checks.
// The values are built in one buffer and are substrings of one string.
func (ic *Interceptor) header(checks []hybrid.Check, d *hybrid.Decision) metadata.MD {
	var arr [512]byte
	b := arr[:0]
	if ic.checks != nil {
		b = httplimit.AppendPolicy(b, checks)
	}
	n := len(b)
	b = httplimit.AppendRateLimit(b, checks, *d)
	s := string(b)
	vals := [2]string{ic.policy, s[n:]}
	if ic.checks != nil {
		vals[0] = s[:n]
	}
	return metadata.MD{mdPolicy: vals[0:1:1], mdRateLimit: vals[1:2:2]}
}

// fail counts a call that could not be decided, and returns the status to
// answer it with: nil in Shadow mode, which serves it.
func (ic *Interceptor) fail(err error) error {
	ic.shard().errors.Add(1)
	if ic.shadow {
		return nil
	}
	return ErrorStatus(err).Err()
}

// denial describes the denial d of a call of method.
func denial(method string, checks []hybrid.Check, d *hybrid.Decision, shadow bool) Denial {
	c := &checks[d.Denied]
	res := d.Results[d.Denied]
	cost := c.Cost
	if cost == 0 {
		cost = 1
	}
	return Denial{
		Method:     method,
		Tier:       c.Tier,
		Key:        c.Key,
		Limit:      c.Limit,
		Cost:       cost,
		Remaining:  res.Remaining,
		RetryAfter: res.RetryAfter,
		Shadow:     shadow,
	}
}
