package rls_test

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// The configuration of the original's integration test (basic.yaml and
// another.yaml), with slower units where it counts per second or minute,
// so that no token comes back while a test runs; and the README's
// messaging example, with a value override and an unlimited value.
const (
	basicYAML = `
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: one_per_day
    rate_limit:
      unit: day
      requests_per_unit: 1
`
	anotherYAML = `
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: hour
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20
`
	messagingYAML = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: to_number
    value: "2061234567"
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: to_number
    value: "911"
    rate_limit:
      unlimited: true
`
)

// TestBasicConfig replays the original's integration test
// (testBasicBaseConfig) over gRPC: a domain no file configures, a limit
// with its remaining count, a limit run out by one descriptor, two
// descriptors at once, and the reset counting down.
func TestBasicConfig(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, basicYAML, anotherYAML)), rls.Config{Mode: exactly}))

	// A domain no file configures: OK, with no limit.
	resp := call(t, c, req("foo", desc("hello", "world")))
	if got, want := statuses(resp), []st{noLimit}; resp.GetOverallCode() != ok || !reflect.DeepEqual(got, want) {
		t.Errorf("unknown domain: %v %v, want OK %v", resp.GetOverallCode(), got, want)
	}

	resp = call(t, c, req("basic", desc("key1", "foo")))
	if got, want := statuses(resp), []st{{code: ok, rpu: 50, unit: second, remaining: 49, reset: 1}}; resp.GetOverallCode() != ok || !reflect.DeepEqual(got, want) {
		t.Errorf("basic key1: %v %v, want OK %v", resp.GetOverallCode(), got, want)
	}

	// One descriptor past its limit: 20 per hour, each request one
	// more 180 s from full.
	for i := range 25 {
		resp := call(t, c, req("another", desc("key2", "user-a")))
		want := st{code: ok, rpu: 20, unit: hour, remaining: uint32(20 - (i + 1)), reset: int64(180 * (i + 1))}
		code := ok
		if i >= 20 {
			code, want.code, want.remaining, want.reset = over, over, 0, 3600
		}
		if got := statuses(resp); resp.GetOverallCode() != code || len(got) != 1 || !near(got[0], want) {
			t.Errorf("key2 request %d: %v %v, want %v %v", i, resp.GetOverallCode(), got, code, want)
		}
	}

	// Two descriptors: key3 (10 per hour) refuses the 11th request, and
	// key2 keeps what the refused requests would have taken.
	for i := range 15 {
		resp := call(t, c, req("another", desc("key2", "user-b"), desc("key3", "user-b")))
		code := ok
		key2 := st{code: ok, rpu: 20, unit: hour, remaining: uint32(20 - (i + 1)), reset: int64(180 * (i + 1))}
		key3 := st{code: ok, rpu: 10, unit: hour, remaining: uint32(10 - (i + 1)), reset: int64(360 * (i + 1))}
		if i >= 10 {
			code = over
			key2.remaining, key2.reset = 10, 1800
			key3.code, key3.remaining, key3.reset = over, 0, 3600
		}
		if got := statuses(resp); resp.GetOverallCode() != code || len(got) != 2 || !near(got[0], key2) || !near(got[1], key3) {
			t.Errorf("key2 and key3 request %d: %v %v, want %v %v", i, resp.GetOverallCode(), got, code, []st{key2, key3})
		}
	}

	// The reset counts down as the bucket refills: one per day, spent,
	// is full again in a day, less the time since.
	first := call(t, c, req("basic", desc("one_per_day", "x"))).GetStatuses()[0]
	second := call(t, c, req("basic", desc("one_per_day", "x"))).GetStatuses()[0]
	if first.GetCode() != ok || second.GetCode() != over {
		t.Errorf("one_per_day: codes %v then %v, want OK then OVER_LIMIT", first.GetCode(), second.GetCode())
	}
	if r := second.GetDurationUntilReset().AsDuration(); r > 24*time.Hour || r < 24*time.Hour-time.Minute {
		t.Errorf("one_per_day: reset %v, want about a day", r)
	}
}

// near reports whether got is want, but for a reset up to a second short
// of want's: the bucket refills while the test runs.
func near(got, want st) bool {
	if got.reset == want.reset-1 {
		got.reset = want.reset
	}
	return got == want
}

// TestNested checks lookups through nested descriptors, value overrides and
// unlimited values, over gRPC: each descriptor is answered by its own limit,
// in its own bucket.
func TestNested(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, messagingYAML)), rls.Config{Mode: exactly}))
	for i, step := range []struct {
		desc *extpb.RateLimitDescriptor
		want st
	}{
		// The nested limit: 5 a day.
		{desc("message_type", "marketing", "to_number", "2061111111"), st{code: ok, rpu: 5, unit: day, remaining: 4, reset: 17280}},
		{desc("message_type", "marketing", "to_number", "2061111111"), st{code: ok, rpu: 5, unit: day, remaining: 3, reset: 2 * 17280}},
		// The same number alone: the top-level limit, 100 a day, a
		// bucket of its own.
		{desc("to_number", "2061111111"), st{code: ok, rpu: 100, unit: day, remaining: 99, reset: 864}},
		// Another number under the nested limit: its own bucket.
		{desc("message_type", "marketing", "to_number", "2062222222"), st{code: ok, rpu: 5, unit: day, remaining: 4, reset: 17280}},
		// A value override: 3 an hour.
		{desc("to_number", "2061234567"), st{code: ok, rpu: 3, unit: hour, remaining: 2, reset: 1200}},
		{desc("to_number", "2061234567"), st{code: ok, rpu: 3, unit: hour, remaining: 1, reset: 2400}},
		{desc("to_number", "2061234567"), st{code: ok, rpu: 3, unit: hour, remaining: 0, reset: 3600}},
		{desc("to_number", "2061234567"), st{code: over, rpu: 3, unit: hour, remaining: 0, reset: 3600}},
		// An unlimited value: never counted.
		{desc("to_number", "911"), st{code: ok, remaining: math.MaxUint32}},
		// More entries than the tree has levels: no limit.
		{desc("to_number", "2061111111", "extra", "x"), noLimit},
		// A level that matches nothing: no limit.
		{desc("message_type", "transactional", "to_number", "2061111111"), noLimit},
		// A descriptor with no entries: no limit, as the original answers.
		{desc(), noLimit},
	} {
		resp := call(t, c, req("messaging", step.desc))
		if got := statuses(resp); len(got) != 1 || !near(got[0], step.want) {
			t.Errorf("step %d %v: %v, want %v", i, step.desc.GetEntries(), got, step.want)
		}
		if wantCode := step.want.code; resp.GetOverallCode() != wantCode {
			t.Errorf("step %d: overall %v, want %v", i, resp.GetOverallCode(), wantCode)
		}
	}
	// Many unlimited requests later, still unlimited.
	for range 10 {
		if got := statuses(call(t, c, req("messaging", desc("to_number", "911")))); got[0].code != ok {
			t.Fatalf("unlimited: %v", got)
		}
	}
}

// TestUnknownDomain checks that a domain no file configures, and
// descriptors that match nothing, are OK with no limit, and that the
// original's domain_not_found stat counts each descriptor of an unknown
// domain.
func TestUnknownDomain(t *testing.T) {
	var counters rls.Counters
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, basicYAML)), rls.Config{Observer: &counters}))
	resp := call(t, c, req("nowhere", desc("key1", "foo"), desc("a", "b", "c", "d")))
	if got, want := statuses(resp), []st{noLimit, noLimit}; resp.GetOverallCode() != ok || !reflect.DeepEqual(got, want) {
		t.Errorf("unknown domain: %v %v, want OK %v", resp.GetOverallCode(), got, want)
	}
	// An override in an unknown domain is ignored, as in the original.
	resp = call(t, c, req("nowhere", override(desc("k", "v"), 0, typepb.RateLimitUnit_SECOND)))
	if got := statuses(resp); resp.GetOverallCode() != ok || !reflect.DeepEqual(got, []st{noLimit}) {
		t.Errorf("override in an unknown domain: %v %v, want OK", resp.GetOverallCode(), got)
	}
	resp = call(t, c, req("basic", desc("nothing", "here")))
	if got := statuses(resp); resp.GetOverallCode() != ok || !reflect.DeepEqual(got, []st{noLimit}) {
		t.Errorf("no match: %v %v, want OK", resp.GetOverallCode(), got)
	}
	if got := counters.DomainNotFound("nowhere"); got != 3 {
		t.Errorf("DomainNotFound(nowhere) = %d, want 3", got)
	}
	if got := counters.DomainNotFound("basic"); got != 0 {
		t.Errorf("DomainNotFound(basic) = %d, want 0", got)
	}
}

// TestInvalidRequests checks the errors of requests the original cannot
// serve either, with its codes and messages.
func TestInvalidRequests(t *testing.T) {
	lim := newLimiter(t)
	empty := new(rls.Rules) // no configuration loaded
	rules := rls.NewRules(load(t, basicYAML))
	srv := newServer(t, lim, rules, rls.Config{})
	c := serve(t, srv)
	none := serve(t, newServer(t, lim, empty, rls.Config{}))
	for i, tt := range []struct {
		c    rlspb.RateLimitServiceClient
		r    *rlspb.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{c, req("", desc("key1", "foo")), codes.Unknown, "rate limit domain must not be empty"},
		{c, req("basic"), codes.Unknown, "rate limit descriptor list must not be empty"},
		{c, req("basic", override(desc("key1", "foo"), 5, typepb.RateLimitUnit_UNKNOWN)), codes.InvalidArgument, "rate limit override of descriptor 0 has no unit"},
		{none, req("basic", desc("key1", "foo")), codes.Unknown, "no rate limit configuration loaded"},
	} {
		_, err := tt.c.ShouldRateLimit(context.Background(), tt.r)
		if s := status.Convert(err); s.Code() != tt.code || s.Message() != tt.msg {
			t.Errorf("#%d: %v, want %v %q", i, err, tt.code, tt.msg)
		}
	}
	if got := srv.Stats(); got.ServiceErrors != 3 || got.Requests != 0 {
		t.Errorf("Stats() = %+v, want 3 service errors and no request", got)
	}
	// A configuration stored later is served at once.
	empty.Store(load(t, basicYAML))
	if resp := call(t, none, req("basic", desc("key1", "foo"))); resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 50 {
		t.Errorf("after Store: %v, want the limit of key1", resp)
	}
}

// TestNewErrors checks what New refuses.
func TestNewErrors(t *testing.T) {
	lim := newLimiter(t)
	rules := new(rls.Rules)
	for i, cfg := range []rls.Config{
		{NearLimitRatio: -0.1},
		{NearLimitRatio: 1.5},
		{NearLimitRatio: math.NaN()},
		{Mode: 7},
	} {
		if _, err := rls.New(lim, rules.Load, cfg); err == nil {
			t.Errorf("#%d New(%+v): no error", i, cfg)
		}
	}
	if _, err := rls.New(nil, rules.Load, rls.Config{}); err == nil {
		t.Errorf("New(nil Limiter): no error")
	}
	if _, err := rls.New(lim, nil, rls.Config{}); err == nil {
		t.Errorf("New(nil rules): no error")
	}
	if _, err := rls.New(lim, rules.Load, rls.Config{NearLimitRatio: 1}); err != nil {
		t.Errorf("New(NearLimitRatio 1): %v", err)
	}
}

// TestClosedLimiter checks the answer of a server whose Limiter is closed:
// Unavailable, for a request that needs it, and counted unanswered.
func TestClosedLimiter(t *testing.T) {
	lim := newLimiter(t)
	srv := newServer(t, lim, rls.NewRules(load(t, anotherYAML)), rls.Config{})
	c := serve(t, srv)
	if err := lim.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := c.ShouldRateLimit(context.Background(), req("another", desc("key3", "closed")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit after Close: %v, want Unavailable", err)
	}
	if st := srv.Stats(); st.Unanswered != 1 {
		t.Errorf("Stats() = %+v, want 1 unanswered", st)
	}
	// No limit: no need of the Limiter.
	if resp := call(t, c, req("another", desc("none", "x"))); resp.GetOverallCode() != ok {
		t.Errorf("no limit after Close: %v, want OK", resp)
	}
}
