package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
)

// client is the peer address of most requests.
const client = "198.51.100.7:1234"

// slow is a rate so low that nothing refills within a test.
const slow = 1e-3

// TestHeaders: the numbers in every rate-limit field, parsed back, over a
// sequence of timed requests against a bucket of 3 tokens refilled at 1 a
// second.
func TestHeaders(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		_, h := newMiddleware(t, lim, httplimit.Config{Limit: hybrid.Limit{Rate: 1, Burst: 3}, LegacyResetUnix: true})
		steps := []struct {
			sleep time.Duration
			code  int
			r, t  int64 // RateLimit: r, t; also X-RateLimit-Remaining, and Reset - now
			retry int64 // Retry-After; -1: none
		}{
			{0, 200, 2, 1, -1},
			{0, 200, 1, 2, -1},
			{0, 200, 0, 3, -1},
			{0, 429, 0, 1, 1},
			{time.Second, 200, 0, 3, -1},
			{1500 * time.Millisecond, 200, 0, 3, -1}, // 1.5 tokens came, 0.5 left: 2.5 s to full
			{0, 429, 0, 1, 1},
			{10 * time.Second, 200, 2, 1, -1},
		}
		for i, s := range steps {
			time.Sleep(s.sleep)
			w := serve(h, request("/", client))
			got := readLimits(t, w)
			if w.Code != s.code {
				t.Errorf("step %d: status %d, want %d", i, w.Code, s.code)
			}
			wantPolicy := []item{{"default", map[string]int64{"q": 3, "w": 3}}}
			if !reflect.DeepEqual(got.policy, wantPolicy) {
				t.Errorf("step %d: RateLimit-Policy %v, want %v", i, got.policy, wantPolicy)
			}
			wantRL := []item{{"default", map[string]int64{"r": s.r, "t": s.t}}}
			if !reflect.DeepEqual(got.rateLimit, wantRL) {
				t.Errorf("step %d: RateLimit %v, want %v", i, got.rateLimit, wantRL)
			}
			now := time.Now().Unix()
			if got.limit != 3 || got.remaining != s.r || got.reset != now+s.t || got.retry != s.retry {
				t.Errorf("step %d: X-RateLimit-Limit %d, -Remaining %d, -Reset now%+d, Retry-After %d; want 3, %d, now%+d, %d",
					i, got.limit, got.remaining, got.reset-now, got.retry, s.r, s.t, s.retry)
			}
		}
	})
}

// TestPolicyWindow: RateLimit-Policy gives the burst as q and the time an
// empty bucket takes to fill as w, in whole seconds rounded up.
func TestPolicyWindow(t *testing.T) {
	tests := []struct {
		lim  hybrid.Limit
		q, w int64
	}{
		{hybrid.Limit{Rate: 10, Burst: 20}, 20, 2},
		{hybrid.Limit{Rate: 1.0 / 60, Burst: 3}, 3, 180},
		{hybrid.Limit{Rate: 10.0 / 60, Burst: 10}, 10, 60},
		{hybrid.Limit{Rate: 3, Burst: 10}, 10, 4},
		{hybrid.Limit{Rate: 1e9, Burst: 1}, 1, 1},
		{hybrid.Limit{Rate: 1e-6, Burst: 1e9}, 1e9, 999_999_999_999_999},
	}
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		for _, tt := range tests {
			_, h := newMiddleware(t, lim, httplimit.Config{Limit: tt.lim, Key: constKey(strconv.FormatFloat(tt.lim.Rate, 'g', -1, 64))})
			got := readLimits(t, serve(h, request("/", client))).policy
			want := []item{{"default", map[string]int64{"q": tt.q, "w": tt.w}}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%+v: RateLimit-Policy %v, want %v", tt.lim, got, want)
			}
		}
	})
}

// constKey is a KeyFunc that keys every request by key.
func constKey(key string) httplimit.KeyFunc {
	return func(*http.Request) (string, error) { return key, nil }
}

// TestDenial: a denied request is answered 429 with Retry-After in whole
// seconds rounded up and an RFC 9457 problem body, and the handler does not
// run.
func TestDenial(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		var denials []httplimit.Denial
		var mw *httplimit.Middleware
		lm := hybrid.Limit{Rate: 0.3, Burst: 1} // a token every 3.33 s
		mw, h := newMiddleware(t, lim, httplimit.Config{
			Name:  "per-ip",
			Limit: lm,
			OnDenied: func(d httplimit.Denial) {
				// Called with no lock held: reading the stats is fine.
				if s := mw.Stats(); s.Denied != uint64(len(denials))+1 {
					t.Errorf("OnDenied: Stats().Denied = %d, want %d", s.Denied, len(denials)+1)
				}
				denials = append(denials, d)
			},
		})
		if w := serve(h, request("/", client)); w.Code != 200 {
			t.Fatalf("first request: status %d", w.Code)
		}
		time.Sleep(time.Second)
		r := request("/", client)
		w := serve(h, r)
		if w.Code != http.StatusTooManyRequests || w.Body.String() == "ok" {
			t.Fatalf("second request: status %d, body %q; want 429 without the handler's body", w.Code, w.Body)
		}
		if got := w.Result().Header.Get("Retry-After"); got != "3" { // 2.33 s
			t.Errorf("Retry-After %q, want 3", got)
		}
		if ct := w.Result().Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("Content-Type %q, want application/problem+json", ct)
		}
		var body struct {
			Type             string   `json:"type"`
			Title            string   `json:"title"`
			Status           int      `json:"status"`
			Detail           string   `json:"detail"`
			ViolatedPolicies []string `json:"violated-policies"`
			Tier             string   `json:"tier"`
			RetryAfter       int64    `json:"retry-after"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("problem body %q: %v", w.Body, err)
		}
		if body.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || body.Title != "Quota Exceeded" ||
			body.Status != 429 || !strings.Contains(body.Detail, `"per-ip"`) ||
			!reflect.DeepEqual(body.ViolatedPolicies, []string{"per-ip"}) || body.Tier != "per-ip" || body.RetryAfter != 3 {
			t.Errorf("problem body %+v", body)
		}
		if len(denials) != 1 {
			t.Fatalf("OnDenied called %d times, want 1", len(denials))
		}
		d := denials[0]
		if d.Request != r || d.Tier != "per-ip" || d.Key != "per-ip:ip:198.51.100.7" || d.Limit != lm || d.Cost != 1 ||
			d.Remaining != 0 || d.RetryAfter <= 2*time.Second || d.RetryAfter > 3*time.Second || d.Shadow {
			t.Errorf("Denial %+v", d)
		}
		// Retry-After never says 0, even for a wait below a second.
		time.Sleep(2 * time.Second) // 3 s after the token was taken, 0.33 s early
		if w := serve(h, request("/", client)); w.Code != 429 || w.Result().Header.Get("Retry-After") != "1" {
			t.Errorf("request 0.33 s early: status %d, Retry-After %q; want 429, 1", w.Code, w.Result().Header.Get("Retry-After"))
		}
		if s := mw.Stats(); s != (httplimit.Stats{Allowed: 1, Denied: 2}) {
			t.Errorf("Stats() = %+v, want 1 allowed, 2 denied", s)
		}
	})
}

// TestCost: a cost function prices a report at 10 tokens and anything else
// at 1; a request that costs more than is left is denied and takes nothing.
func TestCost(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		var denied []int64
		_, h := newMiddleware(t, lim, httplimit.Config{
			Limit: hybrid.Limit{Rate: slow, Burst: 12},
			Cost: func(r *http.Request) int64 {
				if r.URL.Path == "/report" {
					return 10
				}
				return 0 // means 1
			},
			OnDenied: func(d httplimit.Denial) { denied = append(denied, d.Cost) },
		})
		steps := []struct {
			path string
			code int
			r    int64
		}{
			{"/report", 200, 2},
			{"/report", 429, 2},
			{"/cheap", 200, 1},
			{"/cheap", 200, 0},
			{"/cheap", 429, 0},
		}
		for i, s := range steps {
			w := serve(h, request(s.path, client))
			got := readLimits(t, w)
			if w.Code != s.code || len(got.rateLimit) != 1 || got.rateLimit[0].params["r"] != s.r {
				t.Errorf("step %d, %s: status %d, RateLimit %v; want %d, r=%d", i, s.path, w.Code, got.rateLimit, s.code, s.r)
			}
		}
		if !reflect.DeepEqual(denied, []int64{10, 1}) {
			t.Errorf("denied costs %v, want [10 1]", denied)
		}
	})
}

// TestComposite: with Checks, a request passes only if every tier does; a
// tier that denies leaves every other tier as it was; the IETF fields list
// every tier, the legacy fields the one closest to denying.
func TestComposite(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		user := hybrid.Limit{Rate: slow, Burst: 10}
		endpoint := hybrid.Limit{Rate: slow, Burst: 3}
		mw, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(r *http.Request) ([]hybrid.Check, error) {
				return []hybrid.Check{
					{Tier: "user", Key: "u:" + r.Header.Get("X-User"), Limit: user},
					{Tier: "endpoint", Key: "e:" + r.URL.Path, Limit: endpoint},
				}, nil
			},
		})
		steps := []struct {
			path       string
			code       int
			user, endp int64 // r of each tier; -1: not decided
			legacy     int64 // X-RateLimit-Limit
		}{
			{"/a", 200, 9, 2, 3},
			{"/a", 200, 8, 1, 3},
			{"/a", 200, 7, 0, 3},
			{"/a", 429, 7, 0, 3}, // the user's token is given back
			{"/a", 429, 7, 0, 3},
			{"/b", 200, 6, 2, 3},
			{"/c", 200, 5, 2, 3},
			{"/d", 200, 4, 2, 3},
			{"/e", 200, 3, 2, 3},
			{"/f", 200, 2, 2, 10}, // a tie: the first tier
			{"/g", 200, 1, 2, 10},
		}
		for i, s := range steps {
			w := serve(h, request(s.path, client, "X-User", "alice"))
			got := readLimits(t, w)
			if w.Code != s.code {
				t.Errorf("step %d: status %d, want %d", i, w.Code, s.code)
			}
			wantPolicy := []item{
				{"user", map[string]int64{"q": 10, "w": 10_000}},
				{"endpoint", map[string]int64{"q": 3, "w": 3000}},
			}
			if !reflect.DeepEqual(got.policy, wantPolicy) {
				t.Errorf("step %d: RateLimit-Policy %v, want %v", i, got.policy, wantPolicy)
			}
			if len(got.rateLimit) != 2 || got.rateLimit[0].name != "user" || got.rateLimit[1].name != "endpoint" ||
				got.rateLimit[0].params["r"] != s.user || got.rateLimit[1].params["r"] != s.endp {
				t.Errorf("step %d: RateLimit %v, want user r=%d, endpoint r=%d", i, got.rateLimit, s.user, s.endp)
			}
			if got.limit != s.legacy || got.remaining != min(s.user, s.endp) {
				t.Errorf("step %d: X-RateLimit-Limit %d, -Remaining %d; want %d, %d", i, got.limit, got.remaining, s.legacy, min(s.user, s.endp))
			}
			if w.Code == 429 {
				// No tier's window ends after Retry-After.
				for _, it := range got.rateLimit {
					if it.params["t"] > got.retry {
						t.Errorf("step %d: tier %s has t=%d beyond Retry-After %d", i, it.name, it.params["t"], got.retry)
					}
				}
			}
		}
		// The user tier holds exactly what was admitted: 1 token left.
		for i, want := range []bool{true, false} {
			if res, err := lim.Allow(context.Background(), "u:alice", user); err != nil || res.Allowed != want {
				t.Errorf("Allow(u:alice) #%d = %+v, %v; want allowed %v", i+1, res, err, want)
			}
		}
		if s := mw.Stats(); s != (httplimit.Stats{Allowed: 9, Denied: 2}) {
			t.Errorf("Stats() = %+v, want 9 allowed, 2 denied", s)
		}
	})
}

// TestCompositeFirstDenies: when the first tier denies, the later ones are
// not decided and RateLimit lists only the first; RateLimit-Policy lists
// all.
func TestCompositeFirstDenies(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		tight := hybrid.Limit{Rate: slow, Burst: 1}
		loose := hybrid.Limit{Rate: slow, Burst: 5}
		_, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(r *http.Request) ([]hybrid.Check, error) {
				return []hybrid.Check{{Tier: "tight", Key: "t", Limit: tight}, {Tier: "loose", Key: "l", Limit: loose}}, nil
			},
		})
		serve(h, request("/", client))
		w := serve(h, request("/", client))
		got := readLimits(t, w)
		if w.Code != 429 || len(got.policy) != 2 || len(got.rateLimit) != 1 || got.rateLimit[0].name != "tight" {
			t.Errorf("status %d, RateLimit-Policy %v, RateLimit %v; want 429, two policies, tight alone", w.Code, got.policy, got.rateLimit)
		}
		if res, err := lim.AllowN(context.Background(), "l", loose, 4); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Errorf("loose tier after the denial: AllowN(4) = %+v, %v; want allowed with 0 left", res, err)
		}
	})
}

// TestShadow: in Shadow mode every request is served; denials are counted
// apart and reported to OnDenied; the fields are sent only if asked for.
func TestShadow(t *testing.T) {
	for _, withHeaders := range []bool{false, true} {
		t.Run("headers="+strconv.FormatBool(withHeaders), func(t *testing.T) {
			inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
				var shadows int
				mw, h := newMiddleware(t, lim, httplimit.Config{
					Limit:         hybrid.Limit{Rate: slow, Burst: 1},
					Shadow:        true,
					ShadowHeaders: withHeaders,
					OnDenied: func(d httplimit.Denial) {
						if !d.Shadow {
							t.Errorf("Denial.Shadow false in Shadow mode")
						}
						shadows++
					},
				})
				for i := range 3 {
					w := serve(h, request("/", client))
					got := readLimits(t, w)
					if w.Code != 200 || w.Body.String() != "ok" {
						t.Errorf("request %d: status %d, body %q; want served", i, w.Code, w.Body)
					}
					if got.retry != -1 {
						t.Errorf("request %d: Retry-After %d in Shadow mode", i, got.retry)
					}
					if withHeaders {
						if len(got.rateLimit) != 1 || got.rateLimit[0].params["r"] != 0 || got.limit != 1 {
							t.Errorf("request %d: RateLimit %v, X-RateLimit-Limit %d; want r=0, 1", i, got.rateLimit, got.limit)
						}
					} else if len(w.Result().Header) != 1 { // Content-Type
						t.Errorf("request %d: header %v, want no rate-limit field", i, w.Result().Header)
					}
				}
				if s := mw.Stats(); s != (httplimit.Stats{Allowed: 1, ShadowDenied: 2}) {
					t.Errorf("Stats() = %+v, want 1 allowed, 2 shadow-denied", s)
				}
				if shadows != 2 {
					t.Errorf("OnDenied called %d times, want 2", shadows)
				}
			})
		})
	}
}

// TestExempt: Checks that return no check exempt the request: served with
// no field, counted apart.
func TestExempt(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		mw, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(r *http.Request) ([]hybrid.Check, error) { return nil, nil },
		})
		w := serve(h, request("/healthz", client))
		if w.Code != 200 || len(w.Result().Header) != 1 {
			t.Errorf("status %d, header %v; want 200 with no rate-limit field", w.Code, w.Result().Header)
		}
		if s := mw.Stats(); s != (httplimit.Stats{Exempt: 1}) {
			t.Errorf("Stats() = %+v, want 1 exempt", s)
		}
	})
}

// TestBadInput: malformed proxy headers, a 64 KB header and a 10 KB key
// are neither a panic nor an unlimited request.
func TestBadInput(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		one := hybrid.Limit{Rate: slow, Burst: 1}
		var keys []string
		onDenied := func(d httplimit.Denial) { keys = append(keys, d.Key) }
		// Malformed proxy headers from a trusted proxy: keyed by the proxy.
		_, h := newMiddleware(t, lim, httplimit.Config{
			Name:     "ip",
			Limit:    one,
			Key:      httplimit.ClientIP{TrustedProxies: proxies}.Key,
			OnDenied: onDenied,
		})
		huge := strings.Repeat("a", 64<<10)
		for i, xff := range []string{"garbage", "1.2.3.4.5, ,", huge, strings.Repeat("10.0.0.9, ", 64<<10/10) + "x"} {
			w := serve(h, request("/", "10.0.0.1:1", "X-Forwarded-For", xff))
			if want := map[bool]int{true: 200, false: 429}[i == 0]; w.Code != want {
				t.Errorf("X-Forwarded-For %.20q...: status %d, want %d", xff, w.Code, want)
			}
		}
		for _, k := range keys {
			if k != "ip:ip:10.0.0.1" {
				t.Errorf("denied key %q, want the proxy's", k)
			}
		}

		// A 10 KB and a 64 KB API key: hashed, and limited.
		keys = nil
		_, h = newMiddleware(t, lim, httplimit.Config{Limit: one, Key: httplimit.ByHeader("X-API-Key"), OnDenied: onDenied})
		for _, size := range []int{10 << 10, 64 << 10} {
			key := strings.Repeat("k", size)
			codes := []int{serve(h, request("/", client, "X-API-Key", key)).Code, serve(h, request("/", client, "X-API-Key", key)).Code}
			if codes[0] != 200 || codes[1] != 429 {
				t.Errorf("%d-byte key: statuses %v, want [200 429]", size, codes)
			}
		}
		if len(keys) != 2 || keys[0] == keys[1] {
			t.Fatalf("denied keys %q, want two different ones", keys)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, "sha256:") || len(k) != 71 {
				t.Errorf("denied key %q, want sha256: and 64 hex digits", k)
			}
		}
	})
}

// TestLongKeyCollision: a short key spelled like the hash of a long one does
// not share its bucket.
func TestLongKeyCollision(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		one := hybrid.Limit{Rate: slow, Burst: 1}
		long := strings.Repeat("k", 2000)
		sum := sha256.Sum256([]byte(long))
		lookalike := "sha256:" + hex.EncodeToString(sum[:])
		_, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(r *http.Request) ([]hybrid.Check, error) {
				return []hybrid.Check{{Key: r.Header.Get("K"), Limit: one}}, nil
			},
		})
		for i, s := range []struct {
			key  string
			code int
		}{{long, 200}, {lookalike, 200}, {long, 429}, {lookalike, 429}, {long[:1000], 200}} {
			if w := serve(h, request("/", client, "K", s.key)); w.Code != s.code {
				t.Errorf("step %d, %d-byte key %.10q: status %d, want %d", i, len(s.key), s.key, w.Code, s.code)
			}
		}
	})
}

// TestChecksNotModified: the slice Checks returns may be shared, so the
// middleware does not write to it, even when it renames keys and tiers.
func TestChecksNotModified(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		shared := []hybrid.Check{{Key: strings.Repeat("k", 300), Limit: hybrid.Limit{Rate: slow, Burst: 5}}}
		_, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(*http.Request) ([]hybrid.Check, error) { return shared, nil },
		})
		serve(h, request("/", client))
		if shared[0].Tier != "" || len(shared[0].Key) != 300 {
			t.Errorf("the shared check became tier %q, key of %d bytes", shared[0].Tier, len(shared[0].Key))
		}
	})
}

// TestTierNames: tier names are written as structured-field strings, with
// quotes and backslashes escaped and other bytes a String cannot hold
// replaced; unnamed tiers are named after their place.
func TestTierNames(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		l := hybrid.Limit{Rate: slow, Burst: 5}
		_, h := newMiddleware(t, lim, httplimit.Config{
			Checks: func(*http.Request) ([]hybrid.Check, error) {
				return []hybrid.Check{{Tier: `a"b\c`, Key: "1", Limit: l}, {Key: "2", Limit: l}, {Tier: "café\r\n", Key: "3", Limit: l}}, nil
			},
		})
		got := readLimits(t, serve(h, request("/", client)))
		want := []string{`a"b\c`, "tier1", "caf____"}
		for _, list := range [][]item{got.policy, got.rateLimit} {
			var names []string
			for _, it := range list {
				names = append(names, it.name)
			}
			if !reflect.DeepEqual(names, want) {
				t.Errorf("names %q, want %q", names, want)
			}
		}
	})
}

// TestHeaderSelection: Config.Headers chooses the fields; X-RateLimit-Reset
// is in seconds from now.
func TestHeaderSelection(t *testing.T) {
	all := []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}
	tests := []struct {
		headers httplimit.Headers
		want    []string
	}{
		{0, all},
		{httplimit.AllHeaders, all},
		{httplimit.IETFHeaders, all[:2]},
		{httplimit.RateLimitHeader, all[:1]},
		{httplimit.PolicyHeader, all[1:2]},
		{httplimit.LegacyHeaders, all[2:]},
		{httplimit.NoHeaders, nil},
		{httplimit.NoHeaders | httplimit.AllHeaders, nil},
	}
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		for _, single := range []bool{true, false} {
			for _, tt := range tests {
				cfg := httplimit.Config{Headers: tt.headers}
				if single {
					cfg.Limit = hybrid.Limit{Rate: 1, Burst: 10}
				} else {
					cfg.Checks = func(*http.Request) ([]hybrid.Check, error) {
						return []hybrid.Check{{Key: "k", Limit: hybrid.Limit{Rate: 1, Burst: 10}}}, nil
					}
				}
				_, h := newMiddleware(t, lim, cfg)
				w := serve(h, request("/", client))
				var got []string
				for _, name := range all {
					if _, ok := w.Result().Header[name]; ok {
						got = append(got, name)
					}
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("single %v, Headers %b: fields %q, want %q", single, tt.headers, got, tt.want)
				}
				if reset := w.Result().Header.Get("X-Ratelimit-Reset"); reset != "" && (len(reset) > 2 || reset == "0") {
					t.Errorf("single %v, Headers %b: X-RateLimit-Reset %q, want seconds from now, 1 to 10", single, tt.headers, reset)
				}
			}
		}
	})
}

// TestKeyFuncs: ByHeader, ByUser and FirstKey.
func TestKeyFuncs(t *testing.T) {
	type userKey struct{}
	user := httplimit.ByUser(func(ctx context.Context) (string, bool) {
		id, ok := ctx.Value(userKey{}).(string)
		return id, ok
	})
	oops := errors.New("oops")
	first := httplimit.FirstKey(user, httplimit.ByHeader("x-api-key"), httplimit.ClientIP{}.Key)
	tests := []struct {
		name    string
		k       httplimit.KeyFunc
		r       *http.Request
		want    string
		wantErr error
	}{
		{"header", httplimit.ByHeader("x-api-key"), request("/", client, "X-Api-Key", "abc"), "x-api-key:abc", nil},
		{"first header value", httplimit.ByHeader("X-API-Key"), request("/", client, "X-API-Key", "abc", "X-API-Key", "def"), "x-api-key:abc", nil},
		{"no header", httplimit.ByHeader("X-API-Key"), request("/", client), "", httplimit.ErrNoKey},
		{"empty header", httplimit.ByHeader("X-API-Key"), request("/", client, "X-API-Key", ""), "", httplimit.ErrNoKey},
		{"user", user, withUser(request("/", client), userKey{}, "alice"), "user:alice", nil},
		{"no user", user, request("/", client), "", httplimit.ErrNoKey},
		{"empty user", user, withUser(request("/", client), userKey{}, ""), "", httplimit.ErrNoKey},
		{"first: user", first, withUser(request("/", client, "X-API-Key", "abc"), userKey{}, "alice"), "user:alice", nil},
		{"first: API key", first, request("/", client, "X-API-Key", "abc"), "x-api-key:abc", nil},
		{"first: address", first, request("/", client), "ip:198.51.100.7", nil},
		{"first: none", httplimit.FirstKey(user), request("/", client), "", httplimit.ErrNoKey},
		{"first: an error stops", httplimit.FirstKey(func(*http.Request) (string, error) { return "", oops }, httplimit.ClientIP{}.Key), request("/", client), "", oops},
	}
	for _, tt := range tests {
		got, err := tt.k(tt.r)
		if got != tt.want || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
			t.Errorf("%s: key %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

// withUser returns r with id under key in its context.
func withUser(r *http.Request, key any, id string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), key, id))
}

// TestNew: what New rejects.
func TestNew(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ok := hybrid.Limit{Rate: 1, Burst: 1}
		checks := func(*http.Request) ([]hybrid.Check, error) { return nil, nil }
		tests := []struct {
			name string
			lim  *hybrid.Limiter
			cfg  httplimit.Config
			want error // nil: any error
		}{
			{"nil Limiter", nil, httplimit.Config{Limit: ok}, nil},
			{"zero Limit", lim, httplimit.Config{}, hybrid.ErrInvalidLimit},
			{"rate NaN", lim, httplimit.Config{Limit: hybrid.Limit{Rate: math.NaN(), Burst: 1}}, hybrid.ErrInvalidLimit},
			{"burst above 1e9", lim, httplimit.Config{Limit: hybrid.Limit{Rate: 1, Burst: 2e9}}, hybrid.ErrInvalidLimit},
			{"bad mode", lim, httplimit.Config{Limit: hybrid.Limit{Rate: 1, Burst: 1, Mode: 9}}, hybrid.ErrInvalidLimit},
			{"name with a newline", lim, httplimit.Config{Limit: ok, Name: "a\nb"}, nil},
			{"Checks and Limit", lim, httplimit.Config{Limit: ok, Checks: checks}, nil},
			{"Checks and Key", lim, httplimit.Config{Key: constKey("k"), Checks: checks}, nil},
			{"Checks and Name", lim, httplimit.Config{Name: "n", Checks: checks}, nil},
		}
		for _, tt := range tests {
			m, err := httplimit.New(tt.lim, tt.cfg)
			if m != nil || err == nil || tt.want != nil && !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "httplimit: ") {
				t.Errorf("%s: New = %v, %v; want nil and an httplimit error wrapping %v", tt.name, m, err, tt.want)
			}
		}
	})
}

// TestWrap: Wrap is Handler for a function.
func TestWrap(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		mw, _ := newMiddleware(t, lim, httplimit.Config{Limit: hybrid.Limit{Rate: slow, Burst: 1}})
		h := mw.Wrap(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("wrapped")) })
		codes := []int{serve(h, request("/", client)).Code, serve(h, request("/", client)).Code}
		if codes[0] != 200 || codes[1] != 429 {
			t.Errorf("statuses %v, want [200 429]", codes)
		}
	})
}

// TestDownstreamAdd: a handler that adds to a rate-limit field does not
// change another.
func TestDownstreamAdd(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		mw, err := httplimit.New(lim, httplimit.Config{Limit: hybrid.Limit{Rate: slow, Burst: 5}})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("RateLimit", `"upstream";r=1`)
		}))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request("/", client))
		got := w.Result().Header
		if len(got.Values("RateLimit")) != 2 || got.Get("RateLimit-Policy") != `"default";q=5;w=5000` || got.Get("X-RateLimit-Limit") != "5" {
			t.Errorf("header %v", got)
		}
	})
}
