package grpclimit_test

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// client is the peer address of most calls.
const client = "198.51.100.7:4711"

// slow is a rate so low that nothing refills within a test.
const slow = 1e-3

// details returns the RetryInfo and QuotaFailure of a status error, failing
// t if either is missing or there is anything else.
func details(t *testing.T, err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	st := status.Convert(err)
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		default:
			t.Errorf("unexpected detail %T: %v", d, d)
		}
	}
	if ri == nil || qf == nil || len(qf.GetViolations()) != 1 {
		t.Fatalf("details %v: want one RetryInfo and a QuotaFailure with one violation", st.Details())
	}
	return ri, qf
}

// TestUnary: unary calls through a bucket of 2 tokens refilled at 1 every
// 2 s, timed: the header metadata of every call, parsed back; a denial's
// status, its details and its pushback trailer; and the handler runs only
// for the calls allowed.
func TestUnary(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Name: "per-peer", Limit: hybrid.Limit{Rate: 0.5, Burst: 2}})
		s := serve(t, ic, options{peer: tcpAddr(client)})
		steps := []struct {
			sleep time.Duration
			code  codes.Code
			r, t  int64         // the ratelimit field's r and t
			retry time.Duration // the RetryInfo's delay
		}{
			{0, codes.OK, 1, 2, 0},
			{0, codes.OK, 0, 4, 0},
			{0, codes.ResourceExhausted, 0, 2, 2 * time.Second},
			{1500 * time.Millisecond, codes.ResourceExhausted, 0, 1, 500 * time.Millisecond},
			{500 * time.Millisecond, codes.OK, 0, 4, 0},
			{10 * time.Second, codes.OK, 1, 2, 0},
		}
		allowed := 0
		for i, st := range steps {
			time.Sleep(st.sleep)
			header, trailer, err := s.check(context.Background())
			if got := status.Code(err); got != st.code {
				t.Fatalf("step %d: code %v (%v), want %v", i, got, err, st.code)
			}
			policy, rl := limits(t, header)
			wantPolicy := []item{{"per-peer", map[string]int64{"q": 2, "w": 4}}}
			if !reflect.DeepEqual(policy, wantPolicy) {
				t.Errorf("step %d: ratelimit-policy %v, want %v", i, policy, wantPolicy)
			}
			wantRL := []item{{"per-peer", map[string]int64{"r": st.r, "t": st.t}}}
			if !reflect.DeepEqual(rl, wantRL) {
				t.Errorf("step %d: ratelimit %v, want %v", i, rl, wantRL)
			}
			if st.code == codes.OK {
				allowed++
				if len(trailer.Get("grpc-retry-pushback-ms")) != 0 {
					t.Errorf("step %d: pushback trailer %q on an allowed call", i, trailer.Get("grpc-retry-pushback-ms"))
				}
				continue
			}
			ri, qf := details(t, err)
			if got := ri.GetRetryDelay().AsDuration(); got != st.retry {
				t.Errorf("step %d: RetryInfo delay %v, want %v", i, got, st.retry)
			}
			v := qf.GetViolations()[0]
			if v.GetSubject() != "per-peer" || v.GetQuotaId() != "per-peer" || v.GetQuotaValue() != 2 || v.GetDescription() == "" {
				t.Errorf("step %d: violation %v, want subject and quota_id per-peer, quota_value 2, a description", i, v)
			}
			msg := status.Convert(err).Message() + v.GetDescription()
			if strings.Contains(msg, "198.51.100.7") || strings.Contains(msg, "ip:") {
				t.Errorf("step %d: the message or the description shows the key: %q", i, msg)
			}
			if got, want := trailer.Get("grpc-retry-pushback-ms"), strconv.FormatInt(st.retry.Milliseconds(), 10); len(got) != 1 || got[0] != want {
				t.Errorf("step %d: pushback trailer %q, want %q", i, got, want)
			}
		}
		if got := s.served.Load(); got != int64(allowed) {
			t.Errorf("the handler ran %d times, want %d (the calls allowed)", got, allowed)
		}
		if got, want := ic.Stats(), (grpclimit.Stats{Allowed: uint64(allowed), Denied: uint64(len(steps) - allowed)}); got != want {
			t.Errorf("Stats() = %+v, want %+v", got, want)
		}
	})
}

// TestStream: a Watch stream is decided once, when it starts: an allowed
// one gets the header metadata before its first message, a denied one gets
// it with the status and its details, and its handler does not run.
func TestStream(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Name: "streams", Limit: hybrid.Limit{Rate: 0.1, Burst: 1}})
		s := serve(t, ic, options{peer: tcpAddr(client)})
		wantPolicy := []item{{"streams", map[string]int64{"q": 1, "w": 10}}}

		header, err := s.watch(t)
		if err != nil {
			t.Fatalf("first Watch: %v", err)
		}
		policy, rl := limits(t, header)
		if want := []item{{"streams", map[string]int64{"r": 0, "t": 10}}}; !reflect.DeepEqual(policy, wantPolicy) || !reflect.DeepEqual(rl, want) {
			t.Errorf("first Watch: ratelimit-policy %v, ratelimit %v; want %v, %v", policy, rl, wantPolicy, want)
		}

		time.Sleep(4 * time.Second)
		header, err = s.watch(t)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("second Watch: %v, want ResourceExhausted", err)
		}
		policy, rl = limits(t, header)
		if want := []item{{"streams", map[string]int64{"r": 0, "t": 6}}}; !reflect.DeepEqual(policy, wantPolicy) || !reflect.DeepEqual(rl, want) {
			t.Errorf("second Watch: ratelimit-policy %v, ratelimit %v; want %v, %v", policy, rl, wantPolicy, want)
		}
		ri, qf := details(t, err)
		if got := ri.GetRetryDelay().AsDuration(); got != 6*time.Second {
			t.Errorf("RetryInfo delay %v, want 6s", got)
		}
		if v := qf.GetViolations()[0]; v.GetSubject() != "streams" || v.GetQuotaValue() != 1 {
			t.Errorf("violation %v, want subject streams, quota_value 1", v)
		}
		if got := s.served.Load(); got != 1 {
			t.Errorf("the handler ran %d times, want 1", got)
		}
	})
}

// TestComposite: Checks with two tiers. A call passes only if both do; the
// one the second tier denies takes nothing from the first, and its
// metadata list both policies and both tiers decided, the first with its
// tokens given back.
func TestComposite(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		user := hybrid.Limit{Rate: slow, Burst: 10}
		method := hybrid.Limit{Rate: 1, Burst: 2}
		ic := newInterceptor(t, lim, grpclimit.Config{
			Checks: func(ctx context.Context, m string) ([]hybrid.Check, error) {
				return []hybrid.Check{
					{Tier: "user", Key: "user:alice", Limit: user, Cost: 3},
					{Tier: "method", Key: "method:" + m, Limit: method},
				}, nil
			},
		})
		s := serve(t, ic, options{})
		wantPolicy := []item{
			{"user", map[string]int64{"q": 10, "w": 10000}},
			{"method", map[string]int64{"q": 2, "w": 2}},
		}
		steps := []struct {
			code   codes.Code
			rl     []item
			denier string
		}{
			{codes.OK, []item{{"user", map[string]int64{"r": 7, "t": 3000}}, {"method", map[string]int64{"r": 1, "t": 1}}}, ""},
			{codes.OK, []item{{"user", map[string]int64{"r": 4, "t": 6000}}, {"method", map[string]int64{"r": 0, "t": 2}}}, ""},
			{codes.ResourceExhausted, []item{{"user", map[string]int64{"r": 4, "t": 1}}, {"method", map[string]int64{"r": 0, "t": 1}}}, "method"},
		}
		for i, st := range steps {
			header, _, err := s.check(context.Background())
			if status.Code(err) != st.code {
				t.Fatalf("step %d: %v, want %v", i, err, st.code)
			}
			policy, rl := limits(t, header)
			if !reflect.DeepEqual(policy, wantPolicy) || !reflect.DeepEqual(rl, st.rl) {
				t.Errorf("step %d: ratelimit-policy %v, ratelimit %v; want %v, %v", i, policy, rl, wantPolicy, st.rl)
			}
			if st.denier != "" {
				if _, qf := details(t, err); qf.GetViolations()[0].GetSubject() != st.denier {
					t.Errorf("step %d: violation %v, want subject %s", i, qf.GetViolations()[0], st.denier)
				}
			}
		}
		// The denied call took nothing from the user's tier.
		res, err := lim.AllowAll(context.Background(), hybrid.Check{Key: "user:alice", Limit: user, Cost: 4})
		if err != nil || !res.Allowed || res.Results[0].Remaining != 0 {
			t.Errorf("the user's tier after the denial: %+v, %v; want 4 tokens left, all taken now", res, err)
		}
	})
}

// TestLongKey: a key from the metadata longer than 256 bytes is hashed, so
// the Limiter accepts it, and still limits its caller alone.
func TestLongKey(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		var keys []string
		ic := newInterceptor(t, lim, grpclimit.Config{
			Key:      grpclimit.ByMetadata("x-api-key"),
			Limit:    hybrid.Limit{Rate: slow, Burst: 1},
			OnDenied: func(_ context.Context, d grpclimit.Denial) { keys = append(keys, d.Key) },
		})
		s := serve(t, ic, options{})
		a, b := strings.Repeat("a", 5000), strings.Repeat("b", 5000)
		for i, st := range []struct {
			key  string
			code codes.Code
		}{{a, codes.OK}, {b, codes.OK}, {a, codes.ResourceExhausted}, {b, codes.ResourceExhausted}} {
			if _, _, err := s.check(context.Background(), "x-api-key", st.key); status.Code(err) != st.code {
				t.Errorf("step %d: %v, want %v", i, err, st.code)
			}
		}
		if len(keys) != 2 || keys[0] == keys[1] || !strings.HasPrefix(keys[0], "sha256:") || len(keys[0]) != 71 {
			t.Errorf("denied keys %q, want two different ones, sha256: and 64 hex digits", keys)
		}
	})
}

// TestChecksNotModified: the slice Checks returns may be shared, so the
// interceptor does not write to it, even when it renames keys and tiers.
func TestChecksNotModified(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		shared := []hybrid.Check{{Key: strings.Repeat("k", 300), Limit: hybrid.Limit{Rate: slow, Burst: 5}}}
		ic := newInterceptor(t, lim, grpclimit.Config{
			Checks: func(context.Context, string) ([]hybrid.Check, error) { return shared, nil },
		})
		s := serve(t, ic, options{})
		header, _, err := s.check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if shared[0].Tier != "" || len(shared[0].Key) != 300 {
			t.Errorf("the shared check became tier %q, key of %d bytes", shared[0].Tier, len(shared[0].Key))
		}
		if policy, _ := limits(t, header); len(policy) != 1 || policy[0].name != "default" {
			t.Errorf("ratelimit-policy %v, want the tier named default", policy)
		}
	})
}

// TestExempt: a call for which Checks returns no check is served with no
// decision and no metadata.
func TestExempt(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{
			Checks: func(context.Context, string) ([]hybrid.Check, error) { return nil, nil },
		})
		s := serve(t, ic, options{})
		for range 3 {
			header, _, err := s.check(context.Background())
			if err != nil || len(header.Get("ratelimit")) != 0 || len(header.Get("ratelimit-policy")) != 0 {
				t.Errorf("exempt call: %v, header %v; want no error and no rate-limit metadata", err, header)
			}
		}
		if _, err := s.watch(t); err != nil {
			t.Errorf("exempt Watch: %v", err)
		}
		if got, want := ic.Stats(), (grpclimit.Stats{Exempt: 4}); got != want {
			t.Errorf("Stats() = %+v, want %+v", got, want)
		}
	})
}

// TestNoHeaders: NoHeaders sends no rate-limit metadata, on allowed and
// denied calls; the denial still has its details.
func TestNoHeaders(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Limit: hybrid.Limit{Rate: slow, Burst: 1}, NoHeaders: true})
		s := serve(t, ic, options{})
		for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
			header, _, err := s.check(context.Background())
			if status.Code(err) != want || len(header.Get("ratelimit")) != 0 || len(header.Get("ratelimit-policy")) != 0 {
				t.Errorf("call %d: %v, header %v; want %v and no rate-limit metadata", i, err, header, want)
			}
			if want != codes.OK {
				details(t, err)
			}
		}
	})
}
