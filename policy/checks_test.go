package policy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/policy"
)

func mustLoad(t testing.TB, doc string) *policy.Rules {
	t.Helper()
	rules, err := policy.Load(strings.NewReader(doc))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return rules
}

// tiers returns the Tier of each check.
func tiers(cs []hybrid.Check) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Tier)
	}
	return out
}

// routeDoc has one rule per route pattern, and one without a route.
const routeDoc = `{"plans": [{"name": "p", "rules": [
	{"name": "all", "tier": "user", "rate": 1, "burst": 1},
	{"name": "root", "tier": "user", "route": "/", "rate": 1, "burst": 1},
	{"name": "v1", "tier": "user", "route": "/v1/", "rate": 1, "burst": 1},
	{"name": "item", "tier": "user", "route": "GET /v1/items/{id}", "rate": 1, "burst": 1},
	{"name": "item-new", "tier": "user", "route": "GET /v1/items/new", "rate": 1, "burst": 1},
	{"name": "items-post", "tier": "user", "route": "POST /v1/items/", "rate": 1, "burst": 1},
	{"name": "host", "tier": "user", "route": "api.example.com/v1/", "rate": 1, "burst": 1},
	{"name": "files", "tier": "user", "route": "/v1/files/{path...}", "rate": 1, "burst": 1},
	{"name": "exact", "tier": "user", "route": "GET /v1/exact/{$}", "rate": 1, "burst": 1},
	{"name": "item-endpoint", "tier": "endpoint", "route": "GET /v1/items/{id}", "rate": 1, "burst": 1}
]}]}`

// TestRoutes: a rule with a route applies to the requests for which
// ServeMux would pick its pattern, and to no other; the rules without a
// route apply to every request.
func TestRoutes(t *testing.T) {
	rules := mustLoad(t, routeDoc)
	tests := []struct {
		method, target string
		want           []string // besides "all"
	}{
		{"GET", "/v1/items/7", []string{"item", "item-endpoint"}},
		{"HEAD", "/v1/items/7", []string{"item", "item-endpoint"}},          // GET patterns match HEAD
		{"GET", "/v1/items/new", []string{"item-new"}},                      // a literal beats a wildcard
		{"POST", "/v1/items/7", []string{"items-post"}},                     // the method decides
		{"DELETE", "/v1/items/7", []string{"v1"}},                           // no method: the subtree
		{"GET", "http://api.example.com/v1/items/7", []string{"host"}},      // a host pattern first
		{"GET", "http://api.example.com:8080/v1/items/7", []string{"host"}}, // without the port
		{"GET", "http://other.example.com/v1/items/7", []string{"item", "item-endpoint"}},
		{"GET", "/v1/files/a/b/c", []string{"files"}},
		{"GET", "/v1/exact/", []string{"exact"}},
		{"GET", "/v1/exact/x", []string{"v1"}},
		{"GET", "/v1/items/7/", []string{"v1"}},
		{"GET", "/V1/items/7", []string{"root"}}, // case matters
		{"GET", "/other", []string{"root"}},
		{"GET", "/v1", nil},                                           // ServeMux redirects to /v1/
		{"GET", "/v1/../v1/items/7", nil},                             // ServeMux redirects to the clean path
		{"GET", "/v1/items/a%2Fb", []string{"item", "item-endpoint"}}, // an escaped slash is in the segment
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.target, nil)
		cs, err := rules.Checks(r, policy.Identity{Plan: "p", User: "u"})
		if err != nil {
			t.Fatalf("%s %s: %v", tt.method, tt.target, err)
		}
		got := tiers(cs)
		want := append([]string{"all"}, tt.want...)
		if !slices.Equal(got, want) {
			t.Errorf("%s %s: rules %v, want %v", tt.method, tt.target, got, want)
		}
	}
}

// TestRoutesAsServeMux: on the same patterns, the route a request matches
// is the pattern a real ServeMux serves it with, for many requests.
func TestRoutesAsServeMux(t *testing.T) {
	t.Run("with /", func(t *testing.T) { asServeMux(t, routeDoc) })
	// Without a rule for "/", the rules are given one that matches what
	// ServeMux would answer with a 404 or a 405.
	noRoot := strings.Replace(routeDoc, `{"name": "root", "tier": "user", "route": "/", "rate": 1, "burst": 1},`, "", 1)
	if noRoot == routeDoc {
		t.Fatal("the rule root is not in routeDoc")
	}
	t.Run("without /", func(t *testing.T) { asServeMux(t, noRoot) })
}

func asServeMux(t *testing.T, doc string) {
	rules := mustLoad(t, doc)
	plan, _ := rules.Plan("p")
	mux := http.NewServeMux()
	routeOf := map[string]string{} // rule name -> pattern
	for _, r := range plan {
		if r.Route == "" {
			continue
		}
		routeOf[r.Name] = r.Route
		if r.Tier == "endpoint" {
			continue // the same pattern as the rule "item"
		}
		mux.HandleFunc(r.Route, func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Pattern", r.Pattern) })
	}
	methods := []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"}
	hosts := []string{"example.com", "api.example.com", "api.example.com:443", "API.example.com"}
	paths := []string{"/", "", "/v1", "/v1/", "/v1/items", "/v1/items/", "/v1/items/7", "/v1/items/new", "/v1/items/new/",
		"/v1/items/7/x", "/v1/files", "/v1/files/", "/v1/files/a", "/v1/files/a/b", "/v1/exact", "/v1/exact/", "/v1/exact/a",
		"/v1//items/7", "/v1/./items/7", "/v1/items/%41", "/v1/items/a%2Fb", "/v2/x", "/v1/items/7?q=1"}
	n := 0
	for _, m := range methods {
		for _, h := range hosts {
			for _, p := range paths {
				r := httptest.NewRequest(m, "/", nil)
				r.Host = h
				r.URL.Path, r.URL.RawPath, r.URL.RawQuery = p, "", ""
				if before, q, ok := strings.Cut(p, "?"); ok {
					r.URL.Path, r.URL.RawQuery = before, q
				}
				if strings.Contains(p, "%") {
					r.URL.RawPath = p
					r.URL.Path = strings.ReplaceAll(strings.ReplaceAll(p, "%41", "A"), "%2F", "/")
				}
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, r)
				want := w.Header().Get("Pattern")
				cs, err := rules.Checks(r, policy.Identity{Plan: "p", User: "u"})
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				for _, c := range cs {
					if route := routeOf[c.Tier]; route != "" {
						if got != "" && got != route {
							t.Errorf("%s %s%s: rules of two routes, %q and %q", m, h, p, got, route)
						}
						got = route
					}
				}
				if got != want {
					t.Errorf("%s %s%s: route %q, ServeMux serves it with %q", m, h, p, got, want)
				}
				n++
			}
		}
	}
	t.Logf("%d requests compared", n)
}

// TestOrder: the caller's own buckets first, then header, endpoint and
// global ones; document order within each, the plan's before the shared.
func TestOrder(t *testing.T) {
	rules := mustLoad(t, `{
	"shared_rules": [
		{"name": "sg", "tier": "global", "rate": 1, "burst": 1},
		{"name": "sh", "tier": "header:X-Tenant", "rate": 1, "burst": 1},
		{"name": "su", "tier": "user", "rate": 1, "burst": 1}
	],
	"plans": [{"name": "p", "rules": [
		{"name": "ur", "tier": "user", "route": "/x", "rate": 1, "burst": 1},
		{"name": "g", "tier": "global", "rate": 1, "burst": 1},
		{"name": "e", "tier": "endpoint", "route": "/x", "rate": 1, "burst": 1},
		{"name": "h", "tier": "header:X-Tenant", "rate": 1, "burst": 1},
		{"name": "u", "tier": "user", "rate": 1, "burst": 1},
		{"name": "i", "tier": "ip", "rate": 1, "burst": 1},
		{"name": "k", "tier": "api_key", "rate": 1, "burst": 1}
	]}]}`)
	id := policy.Identity{Plan: "p", User: "u1", APIKey: "k1", IP: "192.0.2.1"}
	r := httptest.NewRequest("GET", "/x", nil)
	r.Header.Set("X-Tenant", "t1")
	cs, err := rules.Checks(r, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tiers(cs), []string{"ur", "u", "i", "k", "su", "h", "sh", "e", "g", "sg"}; !slices.Equal(got, want) {
		t.Errorf("GET /x: checks %v, want %v", got, want)
	}
	cs, _ = rules.Checks(httptest.NewRequest("GET", "/y", nil), id)
	if got, want := tiers(cs), []string{"u", "i", "k", "su", "g", "sg"}; !slices.Equal(got, want) {
		t.Errorf("GET /y without X-Tenant: checks %v, want %v", got, want)
	}
}

// TestIdentity: a rule applies only to requests that carry its identity;
// each tier takes its value from the right place.
func TestIdentity(t *testing.T) {
	rules := mustLoad(t, `{"plans": [{"name": "p", "rules": [
		{"name": "u", "tier": "user", "rate": 1, "burst": 1},
		{"name": "k", "tier": "api_key", "rate": 1, "burst": 1},
		{"name": "i", "tier": "ip", "rate": 1, "burst": 1},
		{"name": "h", "tier": "header:x-tenant", "rate": 1, "burst": 1}
	]}]}`)
	tests := []struct {
		id     policy.Identity
		tenant []string
		want   []string // keys
	}{
		{policy.Identity{Plan: "p"}, nil, nil},
		{policy.Identity{Plan: "p", User: "alice"}, nil, []string{"p|u|user|alice"}},
		{policy.Identity{Plan: "p", APIKey: "key1"}, nil, []string{"p|k|api_key|key1"}},
		{policy.Identity{Plan: "p", IP: "2001:db8::1"}, nil, []string{"p|i|ip|2001:db8::1"}},
		{policy.Identity{Plan: "p"}, []string{"acme"}, []string{"p|h|header:X-Tenant|acme"}},
		{policy.Identity{Plan: "p"}, []string{"", "acme"}, nil}, // the first value counts
		{policy.Identity{Plan: "p"}, []string{"acme", "other"}, []string{"p|h|header:X-Tenant|acme"}},
		{policy.Identity{Plan: "p", User: "a", APIKey: "b", IP: "c"}, []string{"d"}, []string{"p|u|user|a", "p|k|api_key|b", "p|i|ip|c", "p|h|header:X-Tenant|d"}},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		for _, v := range tt.tenant {
			r.Header.Add("X-Tenant", v)
		}
		cs, err := rules.Checks(r, tt.id)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range cs {
			got = append(got, c.Key)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("Checks(%+v, X-Tenant %q) keys = %q, want %q", tt.id, tt.tenant, got, tt.want)
		}
	}
}

// TestPlans: the plan comes from the identity; an unknown plan is the
// default plan if there is one, else an error.
func TestPlans(t *testing.T) {
	const plans = `[
		{"name": "free", "rules": [{"name": "u", "tier": "user", "rate": 1, "burst": 1}]},
		{"name": "pro", "rules": [{"name": "u", "tier": "user", "rate": 10, "burst": 10}]}]`
	withDefault := mustLoad(t, `{"default_plan": "free", "plans": `+plans+`}`)
	without := mustLoad(t, `{"plans": `+plans+`}`)
	r := httptest.NewRequest("GET", "/", nil)
	for _, tt := range []struct {
		rules   *policy.Rules
		plan    string
		wantKey string // "" for ErrUnknownPlan
	}{
		{withDefault, "free", "free|u|user|alice"},
		{withDefault, "pro", "pro|u|user|alice"},
		{withDefault, "", "free|u|user|alice"},
		{withDefault, "gold", "free|u|user|alice"},
		{withDefault, "Pro", "free|u|user|alice"},
		{without, "pro", "pro|u|user|alice"},
		{without, "", ""},
		{without, "gold", ""},
		{&policy.Rules{}, "free", ""},
	} {
		cs, err := tt.rules.Checks(r, policy.Identity{Plan: tt.plan, User: "alice"})
		if tt.wantKey == "" {
			if !errors.Is(err, policy.ErrUnknownPlan) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.plan)) || cs != nil {
				t.Errorf("plan %q: Checks = %v, %v; want an error wrapping ErrUnknownPlan naming the plan", tt.plan, cs, err)
			}
			continue
		}
		if err != nil || len(cs) != 1 || cs[0].Key != tt.wantKey {
			t.Errorf("plan %q: Checks = %+v, %v; want the key %q", tt.plan, cs, err, tt.wantKey)
		}
	}
}

// keyDoc has every tier in two plans (one extending the other) and among
// the shared rules, with rule names that look like tiers and values.
const keyDoc = `{
	"shared_rules": [
		{"name": "su", "tier": "user", "rate": 1, "burst": 1},
		{"name": "sg", "tier": "global", "rate": 1, "burst": 1}
	],
	"plans": [
		{"name": "a", "rules": [
			{"name": "user", "tier": "user", "rate": 1, "burst": 1},
			{"name": "ip", "tier": "user", "rate": 1, "burst": 1},
			{"name": "k", "tier": "api_key", "rate": 1, "burst": 1},
			{"name": "i", "tier": "ip", "rate": 1, "burst": 1},
			{"name": "h", "tier": "header:X-A", "rate": 1, "burst": 1},
			{"name": "h2", "tier": "header:X-A|user", "rate": 1, "burst": 1},
			{"name": "e", "tier": "endpoint", "route": "/", "rate": 1, "burst": 1},
			{"name": "g", "tier": "global", "rate": 1, "burst": 1}
		]},
		{"name": "b", "extends": "a"},
		{"name": "a.b", "rules": [{"name": "user", "tier": "user", "rate": 1, "burst": 1}]}
	]}`

// TestKeysApart: two checks have the same key only if they are of the
// same plan and rule and the same identity value, whatever the values
// hold (separators, hash markers, what looks like another key).
func TestKeysApart(t *testing.T) {
	rules := mustLoad(t, keyDoc)
	long := strings.Repeat("x", 200)
	values := []string{"a", "b", "|", "a|b", "user|a", "a|user|a", "#", "#" + strings.Repeat("0", 64), "*", "",
		"a|a|user|a", long, long + "y", strings.Repeat("x", 128), strings.Repeat("x", 129)}
	sum := sha256.Sum256([]byte(long))
	// What the long value hashes to, with and without the marker.
	values = append(values, hex.EncodeToString(sum[:]), "#"+hex.EncodeToString(sum[:]))
	type origin struct{ plan, rule, value string }
	seen := map[string]origin{}
	n := 0
	for _, plan := range []string{"a", "b", "a.b"} {
		for _, v := range values {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-A", v)
			r.Header.Set("X-A|user", v)
			cs, err := rules.Checks(r, policy.Identity{Plan: plan, User: v, APIKey: v, IP: v})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if err := limit.CheckKey(c.Key); err != nil {
					t.Errorf("plan %s rule %s value %q: key %q: %v", plan, c.Tier, v, c.Key, err)
				}
				o := origin{plan, c.Tier, v}
				if c.Tier == "e" || c.Tier == "g" || c.Tier == "sg" {
					o.value = "" // one bucket whatever the identity
				}
				if c.Tier == "su" || c.Tier == "sg" {
					o.plan = "" // shared by every plan
				}
				if prev, ok := seen[c.Key]; ok && prev != o {
					t.Errorf("key %q of %+v and of %+v", c.Key, prev, o)
				}
				seen[c.Key] = o
				n++
			}
		}
	}
	// Per plan a and b: 6 rules with a value (the empty one skips them),
	// and 2 buckets whatever the value; plan a.b: 1 rule; shared: su per
	// value and sg.
	nv := len(values) - 1 // all but the empty one
	if want := 2*(6*nv+2) + nv + nv + 1; len(seen) != want {
		t.Errorf("%d distinct keys from %d checks, want %d", len(seen), n, want)
	}
}

// TestKeyEncoding: the form of keys, and long values hashed so that every
// key is within the limiter's bound.
func TestKeyEncoding(t *testing.T) {
	name := strings.Repeat("n", 64)
	header := strings.Repeat("H", 64)
	rules := mustLoad(t, `{
		"shared_rules": [{"name": "s", "tier": "ip", "rate": 1, "burst": 1}],
		"plans": [{"name": "`+name+`", "rules": [
			{"name": "`+name+`", "tier": "header:`+header+`", "rate": 1, "burst": 1},
			{"name": "u", "tier": "user", "rate": 1, "burst": 1},
			{"name": "e", "tier": "endpoint", "route": "GET /items/{id}", "rate": 1, "burst": 1},
			{"name": "e2", "tier": "endpoint", "route": "/`+strings.Repeat("r", 200)+`", "rate": 1, "burst": 1},
			{"name": "g", "tier": "global", "rate": 1, "burst": 1}
	]}]}`)
	hashed := func(prefix, v string) string {
		sum := sha256.Sum256([]byte(v))
		return prefix + "#" + hex.EncodeToString(sum[:])
	}
	canon := http.CanonicalHeaderKey(header)
	for _, v := range []string{"v", strings.Repeat("v", 128), strings.Repeat("v", 129), strings.Repeat("v", 1<<16)} {
		r := httptest.NewRequest("GET", "/items/1", nil)
		r.Header.Set(header, v)
		cs, err := rules.Checks(r, policy.Identity{Plan: name, User: v, IP: v})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			name: name + "|" + name + "|header:" + canon + "|" + v,
			"u":  name + "|u|user|" + v,
			"s":  "*|s|ip|" + v,
			"e":  name + "|e|endpoint|GET /items/{id}",
			"g":  name + "|g|global|",
		}
		if len(v) > 128 {
			want[name] = hashed(name+"|"+name+"|header:"+canon, v)
			want["u"] = hashed(name+"|u|user", v)
			want["s"] = hashed("*|s|ip", v)
		}
		if len(cs) != len(want) {
			t.Fatalf("value of %d bytes: checks %v, want %d", len(v), tiers(cs), len(want))
		}
		for _, c := range cs {
			if c.Key != want[c.Tier] {
				t.Errorf("value of %d bytes: rule %.10s key %.300q, want %.300q", len(v), c.Tier, c.Key, want[c.Tier])
			}
			if err := limit.CheckKey(c.Key); err != nil {
				t.Errorf("value of %d bytes: rule %.10s: %v", len(v), c.Tier, err)
			}
		}
	}
	cs, _ := rules.Checks(httptest.NewRequest("GET", "/"+strings.Repeat("r", 200), nil), policy.Identity{Plan: name})
	if want := hashed(name+"|e2|endpoint", "/"+strings.Repeat("r", 200)); len(cs) != 2 || cs[0].Key != want {
		t.Errorf("a long route: checks %+v, want the first with key %q", cs, want)
	}
}

// TestChecksFunc: the hook learns the identity from the request.
func TestChecksFunc(t *testing.T) {
	rules := mustLoad(t, `{"plans": [{"name": "p", "rules": [{"name": "u", "tier": "user", "rate": 1, "burst": 1}]}]}`)
	errNoAuth := errors.New("no credentials")
	hook := rules.ChecksFunc(func(r *http.Request) (policy.Identity, error) {
		u := r.Header.Get("X-User")
		if u == "" {
			return policy.Identity{}, errNoAuth
		}
		return policy.Identity{Plan: "p", User: u}, nil
	})
	r := httptest.NewRequest("GET", "/", nil)
	if cs, err := hook(r); !errors.Is(err, errNoAuth) || cs != nil {
		t.Errorf("hook without X-User = %v, %v; want an error wrapping %v", cs, err, errNoAuth)
	}
	r.Header.Set("X-User", "alice")
	cs, err := hook(r)
	if err != nil || len(cs) != 1 || cs[0].Key != "p|u|user|alice" || cs[0].Tier != "u" || cs[0].Cost != 1 {
		t.Errorf("hook = %+v, %v; want one check of key p|u|user|alice", cs, err)
	}
}

// TestAppendChecks: checks are appended to the slice given.
func TestAppendChecks(t *testing.T) {
	rules := mustLoad(t, `{"plans": [{"name": "p", "rules": [{"name": "u", "tier": "user", "rate": 1, "burst": 1}]}]}`)
	dst := make([]hybrid.Check, 1, 4)
	dst[0].Tier = "mine"
	got, err := rules.AppendChecks(dst, httptest.NewRequest("GET", "/", nil), policy.Identity{Plan: "p", User: "a"})
	if err != nil || !slices.Equal(tiers(got), []string{"mine", "u"}) || &got[0] != &dst[0] {
		t.Errorf("AppendChecks = %v, %v; want [mine u] in the same array", tiers(got), err)
	}
}

// TestConcurrentChecks: Rules are read by many goroutines at once.
func TestConcurrentChecks(t *testing.T) {
	rules := mustLoad(t, routeDoc)
	targets := []string{"/v1/items/7", "/v1/items/new", "/v1/files/a", "/other", "/v1"}
	want := map[string][]string{}
	for _, p := range targets {
		cs, _ := rules.Checks(httptest.NewRequest("GET", p, nil), policy.Identity{Plan: "p", User: "u"})
		want[p] = tiers(cs)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				p := targets[(g+i)%len(targets)]
				cs, err := rules.Checks(httptest.NewRequest("GET", p, nil), policy.Identity{Plan: "p", User: "u"})
				if err != nil || !slices.Equal(tiers(cs), want[p]) {
					t.Errorf("GET %s: %v, %v; want %v", p, tiers(cs), err, want[p])
					return
				}
			}
		})
	}
	wg.Wait()
}
