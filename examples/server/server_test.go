package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The limits of the embedded rules.json, in tokens per second and tokens.
var (
	perIP          = tierLimit{rate: 10.0 / 60, burst: 10}
	freeKey        = tierLimit{rate: 10.0 / 60, burst: 10}
	freeUser       = tierLimit{rate: 15.0 / 60, burst: 15}
	freeReports    = tierLimit{rate: 20.0 / 60, burst: 20}
	freeReportsEnd = tierLimit{rate: 30.0 / 60, burst: 30}
	proKey         = tierLimit{rate: 10, burst: 100}
	proUser        = tierLimit{rate: 10, burst: 200}
	proReports     = tierLimit{rate: 100.0 / 60, burst: 100}
	proReportsEnd  = tierLimit{rate: 1000.0 / 60, burst: 1000}
	entKey         = tierLimit{rate: 50, burst: 500}
	entUser        = tierLimit{rate: 100, burst: 1000}
	service        = tierLimit{rate: 1000, burst: 2000}
)

// The demo keys.
const (
	alice1 = "demo-free-alice-1"
	alice2 = "demo-free-alice-2"
	dave   = "demo-free-dave"
	bob    = "demo-pro-bob"
	carol  = "demo-enterprise-carol"
)

// loose marks a tierWant whose tokens left are not checked to the token:
// a leased or optimistic tier, whose Remaining is what this instance knows
// of the bucket (its lease or budget and Redis as last seen, see
// hybrid.Result). Exact tiers are checked exactly, and so is a leased
// tier's first request, which fetches its lease.
const loose = -1

// tierWant is what an allowed response should say of a tier: its limit,
// and the tokens it holds if nothing has refilled, or loose.
type tierWant struct {
	name string
	lim  tierLimit
	r    int64
}

// checkAllowed checks that rep is a 200 whose header fields list exactly
// tiers, in order, with the right numbers: q and w from the limit; r the
// tokens left, plus at most what can have refilled since t0 (nothing if
// t0 is zero: a frozen Redis clock); t the seconds until the bucket is
// full; and the X-RateLimit fields of the tier with the fewest tokens left.
func checkAllowed(t *testing.T, what string, rep reply, t0 time.Time, tiers ...tierWant) {
	t.Helper()
	var elapsed time.Duration
	if !t0.IsZero() {
		elapsed = time.Since(t0)
	}
	if rep.status != http.StatusOK {
		t.Fatalf("%s: status %d, want 200; body %s", what, rep.status, rep.body)
	}
	f := mustFields(t, rep)
	var names []string
	for _, w := range tiers {
		names = append(names, w.name)
	}
	if got, want := strings.Join(f.policyOrd, ","), strings.Join(names, ","); got != want {
		t.Fatalf("%s: RateLimit-Policy tiers %s, want %s", what, got, want)
	}
	if got, want := strings.Join(f.stateOrd, ","), strings.Join(names, ","); got != want {
		t.Fatalf("%s: RateLimit tiers %s, want %s", what, got, want)
	}
	least := -1
	for i, w := range tiers {
		if p, want := f.policy[w.name], [2]int64{w.lim.burst, w.lim.window()}; p != want {
			t.Errorf("%s: RateLimit-Policy %q: q=%d;w=%d, want q=%d;w=%d", what, w.name, p[0], p[1], want[0], want[1])
		}
		st := f.state[w.name]
		if least < 0 || st[0] < f.state[tiers[least].name][0] {
			least = i
		}
		if w.r == loose {
			if st[0] < 0 || st[0] > w.lim.burst || st[1] < 0 || st[1] > w.lim.window() {
				t.Errorf("%s: RateLimit %q: r=%d;t=%d, want r in 0..%d and t in 0..%d", what, w.name, st[0], st[1], w.lim.burst, w.lim.window())
			}
			continue
		}
		rMax := min(w.r+w.lim.refill(elapsed), w.lim.burst)
		if st[0] < w.r || st[0] > rMax {
			t.Errorf("%s: RateLimit %q: r=%d, want %d (up to %d after %v of refill)", what, w.name, st[0], w.r, rMax, elapsed)
		}
		// t is the time to refill what was taken, less the refill since.
		missing := float64(w.lim.burst-w.r) / w.lim.rate
		tMax := ceilSecs(missing - 0.001)
		tMin := max(ceilSecs(missing-elapsed.Seconds()-0.001), 0)
		if st[1] < tMin || st[1] > tMax {
			t.Errorf("%s: RateLimit %q: t=%d, want %d (down to %d after %v)", what, w.name, st[1], tMax, tMin, elapsed)
		}
	}
	if f.retryAfter != -1 {
		t.Errorf("%s: Retry-After %d on an allowed request", what, f.retryAfter)
	}
	lw := tiers[least]
	ls := f.state[lw.name]
	if f.limit != lw.lim.burst || f.remaining != ls[0] || f.reset != ls[1] {
		t.Errorf("%s: X-RateLimit-Limit/Remaining/Reset = %d/%d/%d, want those of tier %q: %d/%d/%d",
			what, f.limit, f.remaining, f.reset, lw.name, lw.lim.burst, ls[0], ls[1])
	}
}

// ceilSecs rounds s up to whole seconds.
func ceilSecs(s float64) int64 {
	n := int64(s)
	if float64(n) < s {
		n++
	}
	return n
}

// frozen is the t0 of checkAllowed for a server on a frozen Redis clock.
var frozen time.Time

// TestHeaders checks that the header fields parse back to the limits of the
// rules and the tokens left, for a fresh key and after k requests, on every
// plan.
func TestHeaders(t *testing.T) {
	ts, _ := startFrozen(t)
	svc := tierWant{"service", service, loose}

	for k := int64(1); k <= 5; k++ {
		checkAllowed(t, fmt.Sprintf("free key, request %d", k), ts.get("/v1/items", alice1), frozen,
			tierWant{"per-key", freeKey, 10 - k}, tierWant{"per-user", freeUser, 15 - k}, svc)
	}
	// The user's second key: a bucket of its own for the key, the user's
	// shared with the first key.
	checkAllowed(t, "free user's second key", ts.get("/v1/items", alice2), frozen,
		tierWant{"per-key", freeKey, 9}, tierWant{"per-user", freeUser, 9}, svc)
	for k := int64(1); k <= 3; k++ {
		checkAllowed(t, fmt.Sprintf("anonymous, request %d", k), ts.get("/v1/items/2", ""), frozen,
			tierWant{"per-ip", perIP, 10 - k}, svc)
	}
	// Leased: the first request fetches the lease and knows the bucket.
	checkAllowed(t, "pro key, request 1", ts.get("/v1/items", bob), frozen,
		tierWant{"per-key", proKey, 99}, tierWant{"per-user", proUser, 199}, svc)
	for k := 2; k <= 3; k++ {
		checkAllowed(t, fmt.Sprintf("pro key, request %d", k), ts.get("/v1/items", bob), frozen,
			tierWant{"per-key", proKey, loose}, tierWant{"per-user", proUser, loose}, svc)
	}
	for k := 1; k <= 3; k++ {
		checkAllowed(t, fmt.Sprintf("enterprise key, request %d", k), ts.get("/v1/me", carol), frozen,
			tierWant{"per-key", entKey, loose}, tierWant{"per-user", entUser, loose}, svc)
	}
	// A report: the report tiers first and last, as the rules order them.
	checkAllowed(t, "pro report", ts.do(request{method: http.MethodPost, path: "/v1/reports", key: bob}), frozen,
		tierWant{"reports", proReports, 90}, tierWant{"per-key", proKey, loose}, tierWant{"per-user", proUser, loose},
		tierWant{"reports-endpoint", proReportsEnd, 990}, svc)
}

// TestHeadersRefill checks the header fields against a Redis whose clock
// runs: the tokens left and the seconds to the reset move with the refill.
func TestHeadersRefill(t *testing.T) {
	ts := startServer(t)
	t0 := time.Now()
	for k := int64(1); k <= 5; k++ {
		checkAllowed(t, fmt.Sprintf("free key, request %d", k), ts.get("/v1/items", alice1), t0,
			tierWant{"per-key", freeKey, 10 - k}, tierWant{"per-user", freeUser, 15 - k}, tierWant{"service", service, loose})
	}
}

// TestDenials checks that a free key is denied exactly when its burst is
// spent, with Retry-After and a problem body, while a pro key at the same
// point is not, and that a denial takes nothing from any tier.
func TestDenials(t *testing.T) {
	ts, m := startFrozen(t)
	svc := tierWant{"service", service, loose}

	for k := int64(1); k <= 10; k++ {
		checkAllowed(t, fmt.Sprintf("free key, request %d", k), ts.get("/v1/items", alice1), frozen,
			tierWant{"per-key", freeKey, 10 - k}, tierWant{"per-user", freeUser, 15 - k}, svc)
	}
	for n := range 2 {
		what := fmt.Sprintf("free key, request %d", 11+n)
		rep := ts.get("/v1/items", alice1)
		// One token at 10 a minute takes 6 s.
		if ra, want := checkDenial(t, what, rep, "per-key"), freeKey.retryAfter(1); ra != want {
			t.Errorf("%s: Retry-After %d, want %d (a token at 10 a minute)", what, ra, want)
		}
		// Denied by the first tier: the others were not decided.
		f := mustFields(t, rep)
		if got := strings.Join(f.stateOrd, ","); got != "per-key" {
			t.Errorf("%s: RateLimit lists %s, want per-key alone", what, got)
		}
		if f.remaining != 0 || f.limit != 10 || f.reset != 6 {
			t.Errorf("%s: X-RateLimit-Limit/Remaining/Reset %d/%d/%d, want 10/0/6", what, f.limit, f.remaining, f.reset)
		}
	}
	// A pro key at the same point is far from its limits.
	checkAllowed(t, "pro key, request 1", ts.get("/v1/items", bob), frozen,
		tierWant{"per-key", proKey, 99}, tierWant{"per-user", proUser, 199}, svc)
	for k := 2; k <= 11; k++ {
		checkAllowed(t, fmt.Sprintf("pro key, request %d", k), ts.get("/v1/items", bob), frozen,
			tierWant{"per-key", proKey, loose}, tierWant{"per-user", proUser, loose}, svc)
	}
	// The user's second key has a key bucket of its own; the user's bucket
	// lost nothing to the two denials, and has 5 tokens left.
	for k := int64(1); k <= 5; k++ {
		checkAllowed(t, fmt.Sprintf("free user's second key, request %d", k), ts.get("/v1/items", alice2), frozen,
			tierWant{"per-key", freeKey, 10 - k}, tierWant{"per-user", freeUser, 5 - k}, svc)
	}
	// Denied by the user's bucket, after the key's: both in one
	// all-or-nothing call, which takes nothing from the key's bucket.
	rep := ts.get("/v1/items", alice2)
	if ra, want := checkDenial(t, "free user spent", rep, "per-user"), freeUser.retryAfter(1); ra != want {
		t.Errorf("free user spent: Retry-After %d, want %d (a token at 15 a minute)", ra, want)
	}
	if st := mustFields(t, rep).state["per-key"]; st[0] != 5 {
		t.Errorf("free user spent: RateLimit per-key r=%d, want 5 (nothing taken)", st[0])
	}

	checkBuckets(t, ts, m,
		bucket{"free|per-key|api_key|alice-1", freeKey, 0},
		bucket{"free|per-key|api_key|alice-2", freeKey, 5},
		bucket{"free|per-user|user|alice", freeUser, 0},
		bucket{"pro|per-key|api_key|bob-1", proKey, 100 - 11},
		bucket{"pro|per-user|user|bob", proUser, 200 - 11},
		bucket{"*|service|global|", service, 2000 - 26},
	)
}

// TestReportCosts checks that a report costs 10 in the report tiers and 1 in
// the others, and that a report denied by the endpoint tier, shared by every
// free user, takes nothing from the user's tiers.
func TestReportCosts(t *testing.T) {
	ts, m := startFrozen(t)
	svc := tierWant{"service", service, loose}
	post := func(key string) reply {
		t.Helper()
		return ts.do(request{method: http.MethodPost, path: "/v1/reports", key: key})
	}

	checkAllowed(t, "alice's first report", post(alice1), frozen,
		tierWant{"reports", freeReports, 10}, tierWant{"per-key", freeKey, 9}, tierWant{"per-user", freeUser, 14},
		tierWant{"reports-endpoint", freeReportsEnd, 20}, svc)
	checkAllowed(t, "alice's second report", post(alice1), frozen,
		tierWant{"reports", freeReports, 0}, tierWant{"per-key", freeKey, 8}, tierWant{"per-user", freeUser, 13},
		tierWant{"reports-endpoint", freeReportsEnd, 10}, svc)
	if ra, want := checkDenial(t, "alice's third report", post(alice1), "reports"), freeReports.retryAfter(10); ra != want {
		t.Errorf("alice's third report: Retry-After %d, want %d (10 tokens at 20 a minute)", ra, want)
	}
	// Alice's denied report took nothing from the endpoint tier: dave gets
	// its last 10 tokens.
	checkAllowed(t, "dave's first report", post(dave), frozen,
		tierWant{"reports", freeReports, 10}, tierWant{"per-key", freeKey, 9}, tierWant{"per-user", freeUser, 14},
		tierWant{"reports-endpoint", freeReportsEnd, 0}, svc)
	rep := post(dave)
	if ra, want := checkDenial(t, "dave's second report", rep, "reports-endpoint"), freeReportsEnd.retryAfter(10); ra != want {
		t.Errorf("dave's second report: Retry-After %d, want %d (10 tokens at 30 a minute)", ra, want)
	}
	// The tiers before the endpoint's show what they hold: nothing taken.
	if st := mustFields(t, rep).state; st["reports"][0] != 10 || st["per-key"][0] != 9 || st["per-user"][0] != 14 {
		t.Errorf("dave's second report: RateLimit %q: want reports r=10, per-key r=9, per-user r=14", rep.header.Get("RateLimit"))
	}
	// A pro user's reports are in buckets of the pro plan.
	checkAllowed(t, "bob's report", post(bob), frozen,
		tierWant{"reports", proReports, 90}, tierWant{"per-key", proKey, 99}, tierWant{"per-user", proUser, 199},
		tierWant{"reports-endpoint", proReportsEnd, 990}, svc)

	// What the allowed requests cost, and nothing for the denied ones: in
	// particular, dave's second report, denied by the endpoint tier, took
	// nothing from dave's report, key and user tiers.
	checkBuckets(t, ts, m,
		bucket{"free|reports|user|alice", freeReports, 0},
		bucket{"free|reports|user|dave", freeReports, 10},
		bucket{"free|per-key|api_key|alice-1", freeKey, 8},
		bucket{"free|per-key|api_key|dave-1", freeKey, 9},
		bucket{"free|per-user|user|alice", freeUser, 13},
		bucket{"free|per-user|user|dave", freeUser, 14},
		bucket{"free|reports-endpoint|endpoint|POST /v1/reports", freeReportsEnd, 0},
		bucket{"pro|reports|user|bob", proReports, 90},
		bucket{"pro|reports-endpoint|endpoint|POST /v1/reports", proReportsEnd, 990},
		bucket{"*|service|global|", service, 2000 - 4},
	)
}

// TestDenialsStop checks that 429s stop when they should: a request is
// denied until the bucket has refilled, which the Retry-After announces, and
// allowed within a small margin after, in each settlement mode.
func TestDenialsStop(t *testing.T) {
	for _, mode := range []string{"exact", "lease", "optimistic"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			denialsStop(t, mode)
		})
	}
}

// denialsStop is TestDenialsStop in one mode.
func denialsStop(t *testing.T, mode string) {
	// One token a second and a burst of 2: after two requests, the next
	// token comes one second after the first.
	rules := writeRules(t, `{
  "default_plan": "anonymous",
  "plans": [
    {"name": "anonymous", "rules": [{"name": "per-ip", "tier": "ip", "rate": "1/s", "burst": 2, "mode": "`+mode+`"}]},
    {"name": "free"}, {"name": "pro"}, {"name": "enterprise"}
  ]
}`)
	ts := startServer(t, "-rules", rules)
	lim := tierLimit{rate: 1, burst: 2}
	start := time.Now() // before the first token is taken
	checkAllowed(t, "request 1", ts.get("/v1/items", ""), start, tierWant{"per-ip", lim, 1})
	checkAllowed(t, "request 2", ts.get("/v1/items", ""), start, tierWant{"per-ip", lim, 0})
	ra := checkDenial(t, "request 3", ts.get("/v1/items", ""), "per-ip")
	denied := time.Now()
	if ra != 1 {
		t.Fatalf("Retry-After %d, want 1", ra)
	}

	// Retry every 10ms until allowed, for at most Retry-After and a margin.
	const margin = 500 * time.Millisecond
	deadline := denied.Add(time.Duration(ra)*time.Second + margin)
	var denials int
	for {
		sent := time.Now()
		rep := ts.get("/v1/items", "")
		if rep.status == http.StatusOK {
			// B + R*T: a third token cannot exist before 1/R after the
			// first was taken (a millisecond for the clocks' reads), but
			// in optimistic mode, which may admit a bounded overshoot
			// (docs/accuracy.md): it refills its budget with its own
			// clock's estimate of the refill.
			if early := start.Add(time.Second - time.Millisecond); sent.Before(early) && mode != "optimistic" {
				t.Errorf("allowed %v after the first request, before the bucket refilled (1s)", sent.Sub(start))
			}
			t.Logf("allowed %v after the denial, %v after the first request, after %d more 429s",
				time.Since(denied), time.Since(start), denials)
			break
		}
		checkDenial(t, "retry", rep, "per-ip")
		denials++
		if time.Now().After(deadline) {
			t.Fatalf("still denied %v after a Retry-After of %ds", time.Since(denied), ra)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if denials == 0 {
		t.Errorf("no request was denied while the bucket refilled")
	}
	// The refilled token is spent: denied again.
	checkDenial(t, "request after the retry", ts.get("/v1/items", ""), "per-ip")
}

// TestSpoofedForwardedFor checks that X-Forwarded-For from an untrusted
// peer is ignored, and that behind trusted proxies distinct clients get
// distinct buckets while a forged leftmost entry changes nothing.
func TestSpoofedForwardedFor(t *testing.T) {
	t.Run("untrusted peer", func(t *testing.T) {
		ts, _ := startFrozen(t) // no trusted proxies
		t0 := frozen
		svc := tierWant{"service", service, loose}
		next := randomAddrs()
		xff := func() request {
			return request{path: "/v1/items", header: map[string]string{
				"X-Forwarded-For": next(), "Forwarded": "for=" + next(),
			}}
		}
		for k := int64(1); k <= 10; k++ {
			checkAllowed(t, fmt.Sprintf("spoofed request %d", k), ts.do(xff()), t0,
				tierWant{"per-ip", perIP, 10 - k}, svc)
		}
		for k := 11; k <= 15; k++ {
			checkDenial(t, fmt.Sprintf("spoofed request %d", k), ts.do(xff()), "per-ip")
		}
		// An unknown API key does not escape either: it is limited by
		// address (and then refused).
		checkDenial(t, "unknown key", ts.get("/v1/items", "guessed-key"), "per-ip")
	})

	t.Run("trusted proxies", func(t *testing.T) {
		ts, _ := startFrozen(t, "-trusted-proxies", "127.0.0.0/8, ::1/128")
		t0 := frozen
		svc := tierWant{"service", service, loose}
		next := randomAddrs()
		via := func(xff string) reply {
			return ts.do(request{path: "/v1/me", header: map[string]string{"X-Forwarded-For": xff}})
		}
		for i := range 5 {
			client := next()
			rep := via(client)
			checkAllowed(t, fmt.Sprintf("client %d (%s)", i, client), rep, t0,
				tierWant{"per-ip", perIP, 9}, svc)
			var me struct {
				ClientIP string `json:"client_ip"`
			}
			if err := json.Unmarshal(rep.body, &me); err != nil || me.ClientIP != client {
				t.Errorf("client %s: /v1/me says %s (%v)", client, rep.body, err)
			}
		}
		// The client, then a proxy in front of the trusted one that is not
		// trusted itself: that proxy is the client, whatever it forwards.
		const hop = "203.0.113.7"
		for k := int64(1); k <= 10; k++ {
			checkAllowed(t, fmt.Sprintf("forged entry %d", k), via(next()+", "+hop), t0,
				tierWant{"per-ip", perIP, 10 - k}, svc)
		}
		checkDenial(t, "forged entry 11", via(next()+", "+hop), "per-ip")
		// IPv6 clients are limited by /64.
		checkAllowed(t, "IPv6 client", via("2001:db8:1:2::1"), t0,
			tierWant{"per-ip", perIP, 9}, svc)
		checkAllowed(t, "IPv6 client, same /64", via("2001:db8:1:2:ffff::9"), t0,
			tierWant{"per-ip", perIP, 8}, svc)
	})
}

// TestMetrics checks that /metrics serves the middleware's and the
// Limiter's counters, and that they match the requests made.
func TestMetrics(t *testing.T) {
	ts := startServer(t)
	for range 11 {
		ts.get("/v1/items", "") // 10 allowed, 1 denied by per-ip
	}
	for range 11 {
		ts.get("/v1/items", alice1) // 10 allowed, 1 denied by per-key
	}
	for range 6 {
		ts.get("/v1/items", alice2) // 5 allowed, 1 denied by per-user
	}
	if rep := ts.get("/v1/items", "unknown"); rep.status != http.StatusTooManyRequests {
		t.Fatalf("unknown key after 11 anonymous requests: status %d, want 429", rep.status)
	}
	if rep := ts.get("/healthz", ""); rep.status != http.StatusOK {
		t.Fatalf("/healthz: status %d", rep.status)
	}
	// Decisions: an anonymous request is decided in 2 tiers (per-ip,
	// service), a free key's in 3 (per-key, per-user, service), and a
	// denied request in those up to the one that denied: the last request
	// of alice's second key passed per-key and was denied by per-user, in
	// one all-or-nothing call: nothing taken, nothing to give back.
	const allowedDecisions = 10*2 + 10*3 + 5*3 + 1
	want := map[string]float64{
		`hybrid_http_requests_total{outcome="allowed"}`:       25,
		`hybrid_http_requests_total{outcome="denied"}`:        4,
		`hybrid_http_requests_total{outcome="shadow_denied"}`: 0,
		`hybrid_http_requests_total{outcome="error"}`:         0,
		`hybrid_http_requests_total{outcome="exempt"}`:        0,
		`hybrid_http_denials_total{tier="per-ip"}`:            2,
		`hybrid_http_denials_total{tier="per-key"}`:           1,
		`hybrid_http_denials_total{tier="per-user"}`:          1,
		`hybrid_refunds_total`:                                0,
		"allowed decisions":                                   allowedDecisions,
		"denied decisions":                                    4,
	}
	// The Limiter adds up the decisions allowed from a lease at its next
	// settlement round (every 100ms): wait for them, within a bound.
	var got map[string]float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = ts.metrics()
		for _, src := range []string{"local", "redis", "fallback"} {
			got["allowed decisions"] += got[`hybrid_decisions_total{result="allowed",source="`+src+`"}`]
			got["denied decisions"] += got[`hybrid_decisions_total{result="denied",source="`+src+`"}`]
		}
		if got["allowed decisions"] >= allowedDecisions || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for name, w := range want {
		if v, ok := got[name]; !ok || v != w {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, w)
		}
	}
	if got["hybrid_live_instances"] != 1 || got["hybrid_degraded"] != 0 {
		t.Errorf("hybrid_live_instances %v, hybrid_degraded %v: want 1 and 0", got["hybrid_live_instances"], got["hybrid_degraded"])
	}
}

// TestShadow checks that in shadow mode every request is served, without
// header fields, and the denials are counted.
func TestShadow(t *testing.T) {
	ts := startServer(t, "-shadow")
	for k := range 12 {
		rep := ts.get("/v1/items", "")
		if rep.status != http.StatusOK || rep.header.Get("RateLimit") != "" || rep.header.Get("Retry-After") != "" {
			t.Fatalf("request %d in shadow mode: status %d, RateLimit %q, Retry-After %q: want 200 and no fields",
				k+1, rep.status, rep.header.Get("RateLimit"), rep.header.Get("Retry-After"))
		}
	}
	m := ts.metrics()
	for name, w := range map[string]float64{
		`hybrid_http_requests_total{outcome="allowed"}`:       10,
		`hybrid_http_requests_total{outcome="shadow_denied"}`: 2,
		`hybrid_http_requests_total{outcome="denied"}`:        0,
		`hybrid_http_denials_total{tier="per-ip"}`:            2,
	} {
		if m[name] != w {
			t.Errorf("%s = %v, want %v", name, m[name], w)
		}
	}
}

// TestAPI checks the endpoints' answers behind the middleware.
func TestAPI(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		req    request
		status int
		body   string // a substring of the body
	}{
		{request{path: "/v1/items"}, 200, `{"id":3,"name":"lantern","stock":3}`},
		{request{path: "/v1/items/4"}, 200, `{"id":4,"name":"compass","stock":19}`},
		{request{path: "/v1/items/99"}, 404, `"detail":"There is no item \"99\"."`},
		{request{path: "/v1/me"}, 200, `{"anonymous":true,"client_ip":"127.0.0.1"}`},
		{request{path: "/v1/me", key: bob}, 200, `{"client_ip":"127.0.0.1","key_id":"bob-1","plan":"pro","user":"bob"}`},
		{request{path: "/v1/items", key: "nope"}, 401, `"detail":"The API key is not known."`},
		{request{method: "POST", path: "/v1/reports"}, 401, `"detail":"Reports need an API key."`},
		{request{method: "POST", path: "/v1/reports", key: carol}, 200, `"user":"carol","plan":"enterprise","items":4,"total_stock":74,"low_stock":[3]}`},
		{request{method: "DELETE", path: "/v1/items/1", key: carol}, 405, ``},
		{request{path: "/healthz"}, 200, `{"status":"ok"}`},
	}
	for _, tt := range tests {
		rep := ts.do(tt.req)
		if rep.status != tt.status || !strings.Contains(string(rep.body), tt.body) {
			t.Errorf("%s %s (key %q) = %d %s, want %d with %s", tt.req.method, tt.req.path, tt.req.key, rep.status, rep.body, tt.status, tt.body)
		}
	}
}

// TestStartErrors checks that bad flags and rules are reported, naming the
// problem, and leave nothing running.
func TestStartErrors(t *testing.T) {
	noDefault := writeRules(t, `{"plans": [{"name": "free"}, {"name": "pro"}, {"name": "enterprise"}]}`)
	noPro := writeRules(t, `{"default_plan": "free", "plans": [{"name": "free"}, {"name": "enterprise"}]}`)
	bad := writeRules(t, `{"plans": [{"name": "free", "rules": [{"name": "a", "tier": "user", "rate": "1/fortnight", "burst": 1}]}]}`)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-trusted-proxies", "10.0.0.0/8,nonsense"}, `"nonsense" is not a network`},
		{[]string{"-bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-rules", bad}, `rule "a": rate: "1/fortnight"`},
		{[]string{"-rules", noDefault}, "anonymous callers"},
		{[]string{"-rules", noPro}, `no plan "pro" for the API key "bob-1"`},
		{[]string{"-addr", "127.0.0.1:99999"}, "invalid port"},
	}
	for _, tt := range tests {
		s, err := start(tt.args, t.Output())
		if err == nil {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			s.serve(ctx) // shuts down at once
			t.Errorf("start(%q) succeeded", tt.args)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("start(%q) = %v, want an error with %q", tt.args, err, tt.want)
		}
	}
}

// TestShutdown checks that the server stops on cancellation, answers no
// more, and leaves no goroutine behind: its listener, the Limiter's
// reconciler, the Redis client and the embedded Redis are all stopped.
func TestShutdown(t *testing.T) {
	baseline := runtime.NumGoroutine()
	ts := startServer(t)
	for range 12 {
		ts.get("/v1/items", alice1)
	}
	ts.do(request{method: http.MethodPost, path: "/v1/reports", key: bob})
	ts.metrics()

	start := time.Now()
	if err := ts.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	t.Logf("shutdown took %v", time.Since(start))
	if _, err := ts.client.Get(ts.base + "/healthz"); err == nil {
		t.Errorf("the server still answers after shutdown")
	}
	ts.tr.CloseIdleConnections()

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines 5s after shutdown, %d before the server started:\n%s", runtime.NumGoroutine(), baseline, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRealRedis runs the service on a real redis-server given by -redis.
func TestRealRedis(t *testing.T) {
	p := redistest.Server(t)
	if !p.Owned() {
		t.Skip("needs a Redis of its own: the buckets' keys are fixed")
	}
	ts := startServer(t, "-redis", p.Addr())
	t0 := time.Now()
	for k := int64(1); k <= 10; k++ {
		checkAllowed(t, fmt.Sprintf("request %d", k), ts.get("/v1/items", alice1), t0,
			tierWant{"per-key", freeKey, 10 - k}, tierWant{"per-user", freeUser, 15 - k},
			tierWant{"service", service, loose})
	}
	checkDenial(t, "request 11", ts.get("/v1/items", alice1), "per-key")
}

// TestMaxWait: with -max-wait, a request over its limit waits for its token
// and is served, and the metrics count it as waited; one whose token would
// come later than that is refused at once. -max-wait may not be negative.
func TestMaxWait(t *testing.T) {
	if _, err := parseFlags([]string{"-max-wait", "-1s"}, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("-max-wait -1s: %v, want a usage error", err)
	}
	// The anonymous tier at 20 a second, burst 1: a token every 50 ms.
	const old = `{"name": "per-ip", "tier": "ip", "rate": "10/min", "burst": 10, "mode": "exact"}`
	if !bytes.Contains(defaultRules, []byte(old)) {
		t.Fatal("rules.json has no per-ip rule to change")
	}
	rules := filepath.Join(t.TempDir(), "rules.json")
	fast := bytes.Replace(defaultRules, []byte(old), []byte(`{"name": "per-ip", "tier": "ip", "rate": "20/s", "burst": 1, "mode": "exact"}`), 1)
	if err := os.WriteFile(rules, fast, 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, "-rules", rules, "-max-wait", "1s")
	for k := range 3 {
		if rep := ts.get("/v1/items", ""); rep.status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200 once it has waited for its token", k+1, rep.status)
		}
	}
	// The rules docs/http.md measures -max-wait with load.
	if rep := startServer(t, "-rules", "testdata/maxwait.json", "-max-wait", "50ms").get("/v1/items", ""); rep.status != http.StatusOK {
		t.Errorf("with testdata/maxwait.json: status %d", rep.status)
	}
	m := ts.metrics()
	if got, want := m[`hybrid_http_requests_total{outcome="waited"}`], 2.0; got != want {
		t.Errorf("waited = %v, want %v", got, want)
	}
	if got, want := m[`hybrid_http_requests_total{outcome="allowed"}`], 1.0; got != want {
		t.Errorf("allowed (at once) = %v, want %v", got, want)
	}
}
