package policy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/policy"
)

func Example() {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("GET", "/v1/reports/42", nil)
	id := policy.Identity{Plan: "free", User: "alice", IP: "203.0.113.7"}
	checks, err := rules.Checks(r, id)
	if err != nil {
		panic(err)
	}
	// The caller's own buckets come first, the shared ones last. The
	// request carries no API key, so the rule per-key does not apply.
	for _, c := range checks {
		fmt.Printf("%s: %q, rate %.4g/s, burst %d, cost %d\n", c.Tier, c.Key, c.Limit.Rate, c.Limit.Burst, c.Cost)
	}
	// Output:
	// per-user: "free|per-user|user|alice", rate 1/s, burst 30, cost 1
	// reports: "free|reports|user|alice", rate 0.1667/s, burst 20, cost 10
	// per-ip: "*|per-ip|ip|203.0.113.7", rate 20/s, burst 100, cost 1
	// reports-endpoint: "free|reports-endpoint|endpoint|GET /v1/reports/{id}", rate 1.667/s, burst 100, cost 10
	// plan-pool: "free|plan-pool|global|", rate 500/s, burst 1000, cost 1
	// service: "*|service|global|", rate 2e+04/s, burst 40000, cost 1
}

func ExampleLoad_errors() {
	_, err := policy.Load(strings.NewReader(`{
  "plans": [
    {"name": "free", "rules": [
      {"name": "reports", "tier": "user", "route": "GET /reports/{id}", "rate": "10/min", "burst": 5, "cost": 10},
      {"name": "items", "tier": "user", "route": "GET /items/{id}", "rate": "10/s", "burst": 20},
      {"name": "search", "tier": "usr", "rate": "10/fortnight", "burts": 5},
      {"name": "export", "tier": "endpoint", "route": "GET /items/{name}", "rate": 1, "burst": 10}
    ]}
  ]
}`))
	fmt.Println(err)
	// Output:
	// policy: line 4, column 111: plan "free" rule "reports": cost: 10 is more than the burst 5: no request could ever pass
	// policy: line 6, column 7: plan "free" rule "search": burst: missing (the bucket's capacity, in tokens)
	// policy: line 6, column 34: plan "free" rule "search": tier: "usr" is not user, api_key, ip, endpoint, global or header:NAME
	// policy: line 6, column 49: plan "free" rule "search": rate: "10/fortnight": the period "fortnight" is not a unit (s, m, h, d) or a duration such as 10s
	// policy: line 6, column 65: plan "free" rule "search": burts: unknown field (did you mean "burst"?)
	// policy: line 7, column 55: plan "free" rule "export": route: "GET /items/{name}" conflicts with the route "GET /items/{id}" of rule "items": GET /items/{name} matches the same requests as GET /items/{id}
}

// ChecksFunc gives an HTTP middleware (here, a handler wrapper) the checks
// of each request; Limiter.AllowAll decides them together.
func ExampleRules_ChecksFunc() {
	m, err := miniredis.Run() // an in-process Redis stands in for a real one
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		panic(err)
	}
	checks := rules.ChecksFunc(func(r *http.Request) (policy.Identity, error) {
		// A real service takes these from a verified session or token.
		return policy.Identity{Plan: r.Header.Get("X-Plan"), User: r.Header.Get("X-User")}, nil
	})
	limited := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cs, err := checks(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			d, err := lim.AllowAll(r.Context(), cs...)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if !d.Allowed {
				http.Error(w, "denied by "+cs[d.Denied].Tier, http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	h := http.NewServeMux()
	h.Handle("GET /v1/reports/{id}", limited(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "report", r.PathValue("id"))
	})))

	// A report costs 10 tokens of a bucket of 20 for a free user, of 200
	// for a pro user.
	for _, plan := range []string{"free", "pro"} {
		for range 3 {
			r := httptest.NewRequest("GET", "/v1/reports/7", nil)
			r.Header.Set("X-Plan", plan)
			r.Header.Set("X-User", "alice")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			fmt.Printf("%s: %d %s", plan, w.Code, w.Body)
		}
	}
	// Output:
	// free: 200 report 7
	// free: 200 report 7
	// free: 429 denied by reports
	// pro: 200 report 7
	// pro: 200 report 7
	// pro: 200 report 7
}
