package rls_test

import (
	"reflect"
	"strings"
	"testing"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// TestHitsAddend checks the cost of a request: the request's hits_addend
// (0 meaning 1), a descriptor's own (which wins, 0 being a check that takes
// nothing), and one above the limit, which is refused and takes nothing.
func TestHitsAddend(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly}))
	for i, step := range []struct {
		r    *rlspb.RateLimitRequest
		want st
	}{
		{&rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{desc("key3", "h")}, HitsAddend: 0},
			st{code: ok, rpu: 10, unit: hour, remaining: 9, reset: 360}},
		{&rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{desc("key3", "h")}, HitsAddend: 3},
			st{code: ok, rpu: 10, unit: hour, remaining: 6, reset: 4 * 360}},
		// The descriptor's own wins over the request's.
		{&rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{hits(desc("key3", "h"), 2)}, HitsAddend: 5},
			st{code: ok, rpu: 10, unit: hour, remaining: 4, reset: 6 * 360}},
		// A check: takes nothing.
		{req("another", hits(desc("key3", "h"), 0)),
			st{code: ok, rpu: 10, unit: hour, remaining: 4, reset: 6 * 360}},
		// More than the limit: refused, takes nothing.
		{req("another", hits(desc("key3", "h"), 11)),
			st{code: over, rpu: 10, unit: hour, remaining: 4, reset: 6 * 360}},
		// More than what remains: refused, takes nothing.
		{&rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{desc("key3", "h")}, HitsAddend: 5},
			st{code: over, rpu: 10, unit: hour, remaining: 4, reset: 6 * 360}},
		{&rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{desc("key3", "h")}, HitsAddend: 4},
			st{code: ok, rpu: 10, unit: hour, remaining: 0, reset: 3600}},
		// A check once spent: over, as one more request would be.
		{req("another", hits(desc("key3", "h"), 0)),
			st{code: over, rpu: 10, unit: hour, remaining: 0, reset: 3600}},
	} {
		resp := call(t, c, step.r)
		if got := statuses(resp); len(got) != 1 || !near(got[0], step.want) || resp.GetOverallCode() != step.want.code {
			t.Errorf("step %d: %v %v, want %v", i, resp.GetOverallCode(), got, step.want)
		}
	}
}

// TestNegativeHits checks a descriptor with is_negative_hits, a refund:
// it takes nothing and is never over (the Limiter cannot add tokens).
func TestNegativeHits(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly}))
	for range 10 {
		call(t, c, req("another", desc("key3", "n")))
	}
	d := hits(desc("key3", "n"), 3)
	d.IsNegativeHits = true
	resp := call(t, c, req("another", d))
	if got, want := statuses(resp), (st{code: ok, rpu: 10, unit: hour, remaining: 0, reset: 3600}); resp.GetOverallCode() != ok || len(got) != 1 || !near(got[0], want) {
		t.Errorf("refund: %v %v, want OK %v", resp.GetOverallCode(), got, want)
	}
}

// TestOverride checks Envoy's limit override: it applies to a descriptor
// of a configured domain, matched or not, with no name; the stats key is
// the domain and the entries; a limit of 0 refuses every request.
func TestOverride(t *testing.T) {
	var counters rls.Counters
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly, Observer: &counters}))
	for i, want := range []st{
		{code: ok, rpu: 2, unit: hour, remaining: 1, reset: 1800},
		{code: ok, rpu: 2, unit: hour, remaining: 0, reset: 3600},
		{code: over, rpu: 2, unit: hour, remaining: 0, reset: 3600},
	} {
		resp := call(t, c, req("another", override(desc("key3", "o", "extra", "e"), 2, typepb.RateLimitUnit_HOUR)))
		if got := statuses(resp); len(got) != 1 || !near(got[0], want) {
			t.Errorf("override request %d: %v, want %v", i, got, want)
		}
	}
	if got, want := counters.Get("another.key3_o.extra_e"), (rls.Hits{Total: 3, WithinLimit: 2, NearLimit: 1, OverLimit: 1}); got != want {
		t.Errorf("override stats %+v, want %+v", got, want)
	}
	// The configured limit of key3 has a bucket of its own.
	if got := statuses(call(t, c, req("another", desc("key3", "o")))); got[0].remaining != 9 {
		t.Errorf("configured key3 after the overrides: %v, want 9 remaining", got)
	}
	resp := call(t, c, req("another", override(desc("key3", "o"), 0, typepb.RateLimitUnit_MINUTE)))
	if got, want := statuses(resp), []st{{code: over, rpu: 0, unit: minute, remaining: 0, reset: 60}}; resp.GetOverallCode() != over || !reflect.DeepEqual(got, want) {
		t.Errorf("override of 0: %v %v, want OVER_LIMIT %v", resp.GetOverallCode(), got, want)
	}
}

// TestReplaces checks replaces, as the original's replaces test does:
// a limit of 0 a minute, named, refuses every request, unless another
// descriptor of the request replaces it; the replaced limit is answered OK
// with no limit, and takes nothing.
func TestReplaces(t *testing.T) {
	const replacesYAML = `
domain: replaces
descriptors:
  - key: foo
    descriptors:
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: override
        rate_limit:
          replaces: [{name: banned_limit}]
          unit: hour
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: hour
          requests_per_unit: 10
      - key: destination_cluster
        value: free
        rate_limit:
          unlimited: true
          replaces: [{name: banned_limit}]
`
	var counters rls.Counters
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, replacesYAML)), rls.Config{Mode: exactly, Observer: &counters}))
	banned := desc("foo", "bkthomps", "bar", "banned")
	for i, step := range []struct {
		descs []*extpb.RateLimitDescriptor
		code  rlspb.RateLimitResponse_Code
		want  []st
	}{
		{[]*extpb.RateLimitDescriptor{banned}, over,
			[]st{{code: over, rpu: 0, unit: minute, name: "banned_limit", reset: 60}}},
		{[]*extpb.RateLimitDescriptor{banned, desc("source_cluster", "proxy", "destination_cluster", "mock")}, over,
			// The refused request takes nothing from mock.
			[]st{{code: over, rpu: 0, unit: minute, name: "banned_limit", reset: 60}, {code: ok, rpu: 10, unit: hour, remaining: 10, reset: 0}}},
		{[]*extpb.RateLimitDescriptor{banned, desc("source_cluster", "proxy", "destination_cluster", "override")}, ok,
			[]st{noLimit, {code: ok, rpu: 2, unit: hour, remaining: 1, reset: 1800}}},
		{[]*extpb.RateLimitDescriptor{desc("source_cluster", "proxy", "destination_cluster", "override"), banned}, ok,
			[]st{{code: ok, rpu: 2, unit: hour, remaining: 0, reset: 3600}, noLimit}},
		{[]*extpb.RateLimitDescriptor{banned, desc("source_cluster", "proxy", "destination_cluster", "override")}, over,
			[]st{noLimit, {code: over, rpu: 2, unit: hour, remaining: 0, reset: 3600}}},
		// An unlimited limit replaces too.
		{[]*extpb.RateLimitDescriptor{banned, desc("source_cluster", "proxy", "destination_cluster", "free")}, ok,
			[]st{noLimit, {code: ok, remaining: 1<<32 - 1}}},
	} {
		resp := call(t, c, req("replaces", step.descs...))
		got := statuses(resp)
		if resp.GetOverallCode() != step.code || len(got) != len(step.want) {
			t.Errorf("step %d: %v %v, want %v %v", i, resp.GetOverallCode(), got, step.code, step.want)
			continue
		}
		for j := range got {
			if !near(got[j], step.want[j]) {
				t.Errorf("step %d, descriptor %d: %v, want %v", i, j, got[j], step.want[j])
			}
		}
	}
	// The replaced limit was counted only when it applied.
	if got := counters.Get("replaces.foo.bar_banned").Total; got != 2 {
		t.Errorf("banned_limit total_hits %d, want 2", got)
	}
}

// TestBucketPerValue checks which requests share a bucket: a descriptor
// matched by its key alone, or by a wildcard, counts each value apart, as
// the original does; share_threshold makes every value of a wildcard share
// one; entries that would read the same once joined (a separator in a key
// or a value) never share one.
func TestBucketPerValue(t *testing.T) {
	const valuesYAML = `
domain: values
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: "files/*"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shared
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: "a|b"
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 1}
---
domain: any
descriptors:
  - key: "*"
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	docs := strings.Split(valuesYAML, "---\n")
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, docs...)), rls.Config{}))
	for i, step := range []struct {
		domain string
		d      *extpb.RateLimitDescriptor
		code   rlspb.RateLimitResponse_Code
	}{
		{"values", desc("user", "alice"), ok},
		{"values", desc("user", "bob"), ok},
		{"values", desc("user", "alice"), over},
		{"values", desc("path", "files/a.pdf"), ok},
		{"values", desc("path", "files/b.csv"), ok},
		{"values", desc("path", "files/a.pdf"), over},
		{"values", desc("shared", "files/a.pdf"), ok},
		{"values", desc("shared", "files/b.csv"), ok},
		{"values", desc("shared", "files/c.txt"), over},
		// ("a", "x") then ("b", "y|b=z"), and ("a", "x|b=y") then ("b",
		// "z"): joined with their separators unescaped, both would read
		// a=x|b=y|b=z. And a key that holds a separator.
		{"values", desc("a", "x", "b", "y|b=z"), ok},
		{"values", desc("a", "x|b=y", "b", "z"), ok},
		{"values", desc("a|b", "x", "b", "y|b=z"), ok},
		{"values", desc("a", "x", "b", "y|b=z"), over},
		// Any key: each key and value apart.
		{"any", desc("k=", "v"), ok},
		{"any", desc("k", "=v"), ok},
		{"any", desc("k\\", "v"), ok},
		{"any", desc("k", "\\v"), ok},
		{"any", desc("k=", "v"), over},
	} {
		resp := call(t, c, req(step.domain, step.d))
		if resp.GetOverallCode() != step.code || len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit() == nil {
			t.Errorf("step %d %v: %v, want %v with a limit", i, step.d.GetEntries(), resp, step.code)
		}
	}
}

// TestLongValues checks values too long for a plain bucket key: they are
// limited (hashed), each apart, however long, and values that share a long
// start do not share a bucket.
func TestLongValues(t *testing.T) {
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, valuesYAMLLong)), rls.Config{}))
	long := strings.Repeat("v", 10_000)
	for i, step := range []struct {
		value string
		code  rlspb.RateLimitResponse_Code
	}{
		{long + "1", ok},
		{long + "2", ok},
		{long + "1", over},
		{long + "2", over},
		{long[:300], ok},
		{long[:300], over},
		{long[:301], ok},
	} {
		resp := call(t, c, req("long", desc("user", step.value)))
		if resp.GetOverallCode() != step.code {
			t.Errorf("step %d (%d bytes): %v, want %v", i, len(step.value), resp.GetOverallCode(), step.code)
		}
	}
}

// valuesYAMLLong is the configuration of TestLongValues.
const valuesYAMLLong = `
domain: long
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestMode checks the settlement mode of a limit: the mode field of its
// rate_limit, else Config.Mode. An exact limit is decided by Redis at
// every request, which the Limiter counts.
func TestMode(t *testing.T) {
	const modeYAML = `
domain: mode
descriptors:
  - key: exact
    rate_limit: {unit: hour, requests_per_unit: 5, mode: exact}
  - key: lease
    rate_limit: {unit: hour, requests_per_unit: 5, mode: lease}
  - key: default
    rate_limit: {unit: hour, requests_per_unit: 5}
`
	for _, tt := range []struct {
		name      string
		def       hybrid.Mode
		wantExact uint64 // exact decisions of 3 requests of each descriptor
	}{
		{"lease by default", hybrid.Lease, 3},
		{"exact by default", hybrid.Exact, 6},
		{"optimistic by default", hybrid.Optimistic, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lim := newLimiter(t)
			c := serve(t, newServer(t, lim, rls.NewRules(load(t, modeYAML)), rls.Config{Mode: tt.def}))
			for range 3 {
				for _, k := range []string{"exact", "lease", "default"} {
					if resp := call(t, c, req("mode", desc(k, "m"))); resp.GetOverallCode() != ok {
						t.Fatalf("%s: %v", k, resp)
					}
				}
			}
			if got := lim.Stats().ExactAllowed; got != tt.wantExact {
				t.Errorf("ExactAllowed = %d, want %d", got, tt.wantExact)
			}
		})
	}
}

// TestRulesSwap checks that a configuration stored while the server serves
// applies from the next request on, and that a bucket keeps what it held
// when its limit changes.
func TestRulesSwap(t *testing.T) {
	rules := rls.NewRules(load(t, anotherYAML))
	c := serve(t, newServer(t, newLimiter(t), rules, rls.Config{}))
	for range 3 {
		call(t, c, req("another", desc("key3", "s")))
	}
	rules.Store(load(t, strings.Replace(anotherYAML, "requests_per_unit: 10", "requests_per_unit: 20", 1)))
	resp := call(t, c, req("another", desc("key3", "s")))
	if got := statuses(resp); got[0].rpu != 20 || got[0].code != ok {
		t.Errorf("after the swap: %v, want the new limit of 20", got)
	}
	rules.Store(load(t, basicYAML))
	if got := statuses(call(t, c, req("another", desc("key3", "s")))); !reflect.DeepEqual(got, []st{noLimit}) {
		t.Errorf("domain gone: %v, want no limit", got)
	}
}

// TestRulesSwapCarries: a reload that changes a descriptor's limit keeps
// what its bucket holds, in requests: 10 a minute, 8 spent, then 6 a
// minute leaves 2, and the next request 1. Before, the bucket's tokens per
// request followed the limit (3 for 10 a minute, 1 for 6), and the 6
// tokens left read as 6 requests: the bucket full again.
func TestRulesSwapCarries(t *testing.T) {
	const yaml = `
domain: swap
descriptors:
  - {key: user, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	rules := rls.NewRules(load(t, yaml))
	c := serve(t, newServer(t, newLimiter(t), rules, rls.Config{Mode: exactly}))
	for range 8 {
		call(t, c, req("swap", desc("user", "a")))
	}
	rules.Store(load(t, strings.Replace(yaml, "requests_per_unit: 10", "requests_per_unit: 6", 1)))
	got := statuses(call(t, c, req("swap", desc("user", "a"))))
	if got[0].rpu != 6 || got[0].code != ok || got[0].remaining != 1 {
		t.Errorf("after 8 of 10 a minute, then a reload to 6: %+v, want OK under the limit of 6 with 1 left", got)
	}
}

// TestUnits checks a limit in every unit, from the slowest to the
// largest: each request makes the bucket a whole unit/N from full, to the
// second (the Limiter refills each exactly), and the largest
// requests_per_unit is served as the Limiter's largest burst.
func TestUnits(t *testing.T) {
	const unitsYAML = `
domain: units
descriptors:
  - {key: second, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: minute, rate_limit: {unit: minute, requests_per_unit: 7}}
  - {key: hour, rate_limit: {unit: hour, requests_per_unit: 7}}
  - {key: day, rate_limit: {unit: day, requests_per_unit: 7}}
  - {key: week, rate_limit: {unit: week, requests_per_unit: 7}}
  - {key: month, rate_limit: {unit: month, requests_per_unit: 7}}
  - {key: year, rate_limit: {unit: year, requests_per_unit: 1}}
  - {key: year5, rate_limit: {unit: year, requests_per_unit: 5}}
  - {key: huge, rate_limit: {unit: second, requests_per_unit: 4294967295}}
`
	c := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, unitsYAML)), rls.Config{Mode: exactly}))
	for _, tt := range []struct {
		key       string
		remaining uint32
		reset     int64 // seconds after one request
	}{
		{"second", 0, 1},
		{"minute", 6, 9}, // 60/7 = 8.57 s, rounded up
		{"hour", 6, 515}, // 514.29 s
		{"day", 6, 12343},
		{"week", 6, 86400},
		{"month", 6, 370286},
		{"year", 0, 31536000},
		{"year5", 4, 6307200},
		{"huge", 999_999_999, 1},
	} {
		resp := call(t, c, req("units", desc(tt.key, "u")))
		s := resp.GetStatuses()[0]
		if resp.GetOverallCode() != ok || s.GetLimitRemaining() != tt.remaining || s.GetDurationUntilReset().GetSeconds() != tt.reset {
			t.Errorf("%s: %v, remaining %d, reset %v; want OK, %d, %ds", tt.key, resp.GetOverallCode(), s.GetLimitRemaining(), s.GetDurationUntilReset().AsDuration(), tt.remaining, tt.reset)
		}
	}
}
