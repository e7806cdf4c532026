package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// newLimiter returns a Limiter on an in-process Redis, which stands in for a
// real one in these examples, and a func that stops both.
func newLimiter() (*hybrid.Limiter, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	return lim, func() {
		lim.Close(context.Background())
		rdb.Close()
		m.Close()
	}
}

func Example() {
	lim, stop := newLimiter()
	defer stop()

	// Two requests at once, then one a minute, per client address. The
	// service runs behind a load balancer in 10.0.0.0/8 that appends the
	// client's address to X-Forwarded-For.
	mw, err := httplimit.New(lim, httplimit.Config{
		Name: "per-ip",
		Key: httplimit.ClientIP{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		}.Key,
		Limit: hybrid.Limit{Rate: 1.0 / 60, Burst: 2},
	})
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:4711" // the load balancer
		r.Header.Set("X-Forwarded-For", "198.51.100.7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		if w.Code == http.StatusTooManyRequests {
			fmt.Println("Retry-After:", w.Header().Get("Retry-After"))
		}
	}
	fmt.Printf("%+v\n", mw.Stats())
	// Output:
	// 200 "per-ip";q=2;w=120 "per-ip";r=1;t=60
	// 200 "per-ip";q=2;w=120 "per-ip";r=0;t=120
	// 429 "per-ip";q=2;w=120 "per-ip";r=0;t=60
	// Retry-After: 60
	// {Allowed:2 Denied:1 ShadowDenied:0 Errors:0 Exempt:0 Waited:0}
}

func ExampleConfig_checks() {
	lim, stop := newLimiter()
	defer stop()

	// Two tiers: each API key may make 100 requests an hour, and 2 reports
	// at once, then one every 20 seconds; a report costs 10 tokens of the
	// hourly quota. A request passes only if both tiers do, and a request
	// the report tier denies costs nothing in the hourly one.
	hourly := hybrid.Limit{Rate: 100.0 / 3600, Burst: 100}
	reports := hybrid.Limit{Rate: 1.0 / 20, Burst: 2}
	apiKey := httplimit.ByHeader("X-API-Key")
	mw, err := httplimit.New(lim, httplimit.Config{
		Checks: func(r *http.Request) ([]hybrid.Check, error) {
			key, err := apiKey(r)
			if err != nil {
				return nil, err // no API key: 400
			}
			checks := []hybrid.Check{{Tier: "hourly", Key: "hourly:" + key, Limit: hourly}}
			if r.URL.Path == "/report" {
				checks[0].Cost = 10
				checks = append(checks, hybrid.Check{Tier: "reports", Key: "reports:" + key, Limit: reports})
			}
			return checks, nil
		},
		Headers: httplimit.IETFHeaders,
	})
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, path := range []string{"/report", "/report", "/report", "/items"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-API-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(path, w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// /report 200 "hourly";r=90;t=360, "reports";r=1;t=20
	// /report 200 "hourly";r=80;t=720, "reports";r=0;t=40
	// /report 429 "hourly";r=80;t=20, "reports";r=0;t=20
	// /items 200 "hourly";r=79;t=756
}

func ExampleClientIP() {
	c := httplimit.ClientIP{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Header:         httplimit.Forwarded,
	}
	for _, remote := range []string{"10.0.0.1:4711", "203.0.113.9:4711"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		// The client forged the first element; the proxy in 10.0.0.0/8
		// appended the second.
		r.Header.Set("Forwarded", `for=192.0.2.1, for="[2001:db8:cafe::17]:4711"`)
		key, _ := c.Key(r)
		fmt.Println(remote, "->", c.Addr(r), key)
	}
	// Output:
	// 10.0.0.1:4711 -> 2001:db8:cafe::17 ip:2001:db8:cafe::/64
	// 203.0.113.9:4711 -> 203.0.113.9 ip:203.0.113.9
}
