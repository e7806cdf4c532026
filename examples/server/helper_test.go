package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/global"
)

// testServer is the service started in-process on a free loopback port, with
// a real HTTP client of its own.
type testServer struct {
	t      *testing.T
	base   string // http://127.0.0.1:PORT
	client *http.Client
	tr     *http.Transport
	stop   func() error // ends serve and returns its error; idempotent
}

// startServer starts the service with args on 127.0.0.1:0 and stops it at
// cleanup (failing the test if serve fails or overruns).
func startServer(t *testing.T, args ...string) *testServer {
	t.Helper()
	// The race detector slows the in-process Redis down past the 50ms
	// default bound of a Redis call: the fallback policy would then decide,
	// with numbers of its own. The bound is generous, and stop checks that
	// the fallback decided nothing.
	s, err := start(append([]string{"-addr", "127.0.0.1:0", "-redis-timeout", "2s"}, args...), t.Output())
	if err != nil {
		t.Fatalf("start(%q) = %v", args, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.serve(ctx) }()
	tr := &http.Transport{}
	ts := &testServer{
		t:      t,
		base:   "http://" + s.Addr(),
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second},
		tr:     tr,
	}
	ts.stop = sync.OnceValue(func() error {
		ts.checkRedisDecided()
		cancel()
		defer tr.CloseIdleConnections()
		select {
		case err := <-done:
			return err
		case <-time.After(drainTimeout + limiterTimeout + 2*closeTimeout + time.Second):
			return errors.New("serve has not returned after its shutdown bounds")
		}
	})
	t.Cleanup(func() {
		if err := ts.stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ts
}

// startFrozen starts the service on a Redis of the test's own (miniredis)
// whose clock stands still: no bucket refills, so every number the
// service reports is exact, and what each bucket holds can be read back
// from Redis once the service has stopped (see checkBuckets).
func startFrozen(t *testing.T, args ...string) (*testServer, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Now())
	return startServer(t, append([]string{"-redis", m.Addr()}, args...)...), m
}

// bucket is what a bucket in Redis should hold.
type bucket struct {
	key    string // the limiter's key, as the rules build it
	lim    tierLimit
	tokens int64
}

// checkBuckets stops ts, which then settles everything with Redis (leases
// go back, optimistic spending is charged, give-backs are made), and
// checks that each bucket in m holds what it should: its burst less what
// the allowed requests cost, with no refill since m's clock stands still.
func checkBuckets(t *testing.T, ts *testServer, m *miniredis.Miniredis, want ...bucket) {
	t.Helper()
	if err := ts.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()
	g, err := global.New(rdb, global.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		ml, err := global.Limit{Rate: w.lim.rate, Burst: w.lim.burst}.Micro()
		if err != nil {
			t.Fatal(err)
		}
		// A settlement of nothing: it reads the bucket.
		var rep [1]global.Reply
		if err := g.Settle(context.Background(), []global.Settlement{{Key: w.key, Limit: ml}}, rep[:]); err != nil || rep[0].Err != nil {
			t.Fatalf("reading bucket %q: %v, %v", w.key, err, rep[0].Err)
		}
		if got := rep[0].Tokens; got != w.tokens*1_000_000 {
			t.Errorf("bucket %q holds %.6f tokens in Redis, want %d", w.key, float64(got)/1e6, w.tokens)
		}
	}
}

// checkRedisDecided checks that every decision so far was made with Redis:
// none by the fallback policy, no failed Redis call.
func (ts *testServer) checkRedisDecided() {
	ts.t.Helper()
	m := ts.metrics()
	for _, name := range []string{
		`hybrid_decisions_total{result="allowed",source="fallback"}`,
		`hybrid_decisions_total{result="denied",source="fallback"}`,
		`hybrid_exact_errors_total`,
		`hybrid_fetch_errors_total`,
		`hybrid_fetch_timeouts_total`,
		`hybrid_settlement_round_errors_total`,
	} {
		if v, ok := m[name]; !ok || v != 0 {
			ts.t.Errorf("%s = %v (present %v), want 0: Redis did not decide everything", name, v, ok)
		}
	}
}

// reply is a response, read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// request is a request of a test: an API key ("" for none) and headers.
type request struct {
	method, path string
	key          string
	header       map[string]string
}

// do sends req and reads the response.
func (ts *testServer) do(req request) reply {
	ts.t.Helper()
	if req.method == "" {
		req.method = http.MethodGet
	}
	r, err := http.NewRequest(req.method, ts.base+req.path, nil)
	if err != nil {
		ts.t.Fatal(err)
	}
	if req.key != "" {
		r.Header.Set(apiKeyHeader, req.key)
	}
	for k, v := range req.header {
		r.Header.Set(k, v)
	}
	resp, err := ts.client.Do(r)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", req.method, req.path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		ts.t.Fatalf("%s %s: reading the body: %v", req.method, req.path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

// get sends GET path with the API key key.
func (ts *testServer) get(path, key string) reply {
	ts.t.Helper()
	return ts.do(request{path: path, key: key})
}

// member is one member of a structured-field List: a String with integer
// parameters, as RateLimit and RateLimit-Policy send them.
type member struct {
	name   string
	params map[string]int64
}

// parseList parses a structured-field List (RFC 9651) whose members are
// Strings with integer parameters: `"a";q=1;w=2, "b";q=3`.
func parseList(v string) ([]member, error) {
	var out []member
	i := 0
	for {
		for i < len(v) && v[i] == ' ' {
			i++
		}
		if i >= len(v) || v[i] != '"' {
			return nil, fmt.Errorf("at %d of %q: want a String", i, v)
		}
		var name strings.Builder
		for i++; ; i++ {
			if i >= len(v) {
				return nil, fmt.Errorf("unterminated String in %q", v)
			}
			c := v[i]
			if c == '\\' {
				i++
				if i >= len(v) || v[i] != '"' && v[i] != '\\' {
					return nil, fmt.Errorf("bad escape in %q", v)
				}
				c = v[i]
			} else if c == '"' {
				i++
				break
			}
			name.WriteByte(c)
		}
		m := member{name: name.String(), params: map[string]int64{}}
		for i < len(v) && v[i] == ';' {
			j := strings.IndexByte(v[i:], '=')
			if j < 0 {
				return nil, fmt.Errorf("parameter without value in %q", v)
			}
			key := v[i+1 : i+j]
			i += j + 1
			k := i
			for k < len(v) && (v[k] >= '0' && v[k] <= '9' || v[k] == '-') {
				k++
			}
			n, err := strconv.ParseInt(v[i:k], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parameter %s in %q: %v", key, v, err)
			}
			if _, dup := m.params[key]; dup {
				return nil, fmt.Errorf("parameter %s twice in %q", key, v)
			}
			m.params[key] = n
			i = k
		}
		out = append(out, m)
		for i < len(v) && v[i] == ' ' {
			i++
		}
		if i == len(v) {
			return out, nil
		}
		if v[i] != ',' {
			return nil, fmt.Errorf("at %d of %q: want a comma", i, v)
		}
		i++
	}
}

// fields are the rate-limit header fields of a response, parsed.
type fields struct {
	policy    map[string][2]int64 // tier -> q, w
	policyOrd []string
	state     map[string][2]int64 // tier -> r, t
	stateOrd  []string
	// legacy X-RateLimit-Limit, -Remaining, -Reset; -1 if absent
	limit, remaining, reset int64
	retryAfter              int64 // -1 if absent
}

// parseFields parses the rate-limit fields of h.
func parseFields(h http.Header) (fields, error) {
	f := fields{policy: map[string][2]int64{}, state: map[string][2]int64{}}
	if v := h.Get("RateLimit-Policy"); v != "" {
		ms, err := parseList(v)
		if err != nil {
			return f, fmt.Errorf("RateLimit-Policy: %v", err)
		}
		for _, m := range ms {
			f.policy[m.name] = [2]int64{m.params["q"], m.params["w"]}
			f.policyOrd = append(f.policyOrd, m.name)
		}
	}
	if v := h.Get("RateLimit"); v != "" {
		ms, err := parseList(v)
		if err != nil {
			return f, fmt.Errorf("RateLimit: %v", err)
		}
		for _, m := range ms {
			f.state[m.name] = [2]int64{m.params["r"], m.params["t"]}
			f.stateOrd = append(f.stateOrd, m.name)
		}
	}
	num := func(name string) (int64, error) {
		v := h.Get(name)
		if v == "" {
			return -1, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %v", name, err)
		}
		return n, nil
	}
	var err error
	for _, p := range []struct {
		name string
		dst  *int64
	}{
		{"X-RateLimit-Limit", &f.limit},
		{"X-RateLimit-Remaining", &f.remaining},
		{"X-RateLimit-Reset", &f.reset},
		{"Retry-After", &f.retryAfter},
	} {
		if *p.dst, err = num(p.name); err != nil {
			return f, err
		}
	}
	return f, nil
}

// mustFields parses the fields of rep, failing the test if they are malformed.
func mustFields(t *testing.T, rep reply) fields {
	t.Helper()
	f, err := parseFields(rep.header)
	if err != nil {
		t.Fatalf("malformed rate-limit fields: %v\n%v", err, rep.header)
	}
	return f
}

// tierLimit is a tier's limit as the rules give it.
type tierLimit struct {
	rate  float64 // tokens per second
	burst int64
}

// window is the w of RateLimit-Policy: burst/rate, rounded up.
func (l tierLimit) window() int64 {
	return int64(math.Ceil(float64(l.burst)/l.rate - 1e-9))
}

// refill returns the most whole tokens the tier can have refilled in d.
func (l tierLimit) refill(d time.Duration) int64 {
	return int64(math.Floor(l.rate * d.Seconds()))
}

// retryAfter returns the Retry-After, in whole seconds, of a request that
// needs n more tokens of an empty bucket: the limiter counts in
// micro-tokens and rounds the rate to a whole number of them per second,
// so 20 a minute refills 10 tokens in 30.00003 s, a Retry-After of 31.
func (l tierLimit) retryAfter(n int64) int64 {
	perSec := math.Round(l.rate * 1e6)
	return max(ceilSecs(float64(n)*1e6/perSec), 1)
}

// problem is a problem+json body of a denial.
type problem struct {
	Type             string   `json:"type"`
	Status           int      `json:"status"`
	Tier             string   `json:"tier"`
	ViolatedPolicies []string `json:"violated-policies"`
	RetryAfter       int64    `json:"retry-after"`
}

// checkDenial checks that rep is a 429 of tier with a problem body whose
// retry-after is the Retry-After field, and returns that.
func checkDenial(t *testing.T, what string, rep reply, tier string) int64 {
	t.Helper()
	if rep.status != http.StatusTooManyRequests {
		t.Fatalf("%s: status %d, want 429; body %s", what, rep.status, rep.body)
	}
	if ct := rep.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	var p problem
	if err := json.Unmarshal(rep.body, &p); err != nil {
		t.Fatalf("%s: body %s: %v", what, rep.body, err)
	}
	f := mustFields(t, rep)
	if p.Status != 429 || p.Tier != tier || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != tier ||
		p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" {
		t.Errorf("%s: problem %+v, want status 429 of the quota-exceeded type, tier and violated-policies %q", what, p, tier)
	}
	if f.retryAfter < 1 || p.RetryAfter != f.retryAfter {
		t.Errorf("%s: Retry-After %d, problem retry-after %d: want the same, at least 1", what, f.retryAfter, p.RetryAfter)
	}
	if st, ok := f.state[tier]; !ok || st[1] != f.retryAfter {
		t.Errorf("%s: RateLimit %q: want tier %q with t = Retry-After %d", what, rep.header.Get("RateLimit"), tier, f.retryAfter)
	}
	return f.retryAfter
}

// writeRules writes a rules document to a file in t's temporary directory
// and returns its path.
func writeRules(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// metrics scrapes /metrics and returns the samples, by name and labels as
// they are written: `hybrid_decisions_total{result="allowed",source="local"}`.
func (ts *testServer) metrics() map[string]float64 {
	ts.t.Helper()
	rep := ts.get("/metrics", "")
	if rep.status != http.StatusOK {
		ts.t.Fatalf("GET /metrics: status %d", rep.status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(rep.body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			ts.t.Fatalf("GET /metrics: malformed line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// randomAddrs returns a func that returns a random public IPv4 address
// different from every one it returned before.
func randomAddrs() func() string {
	seen := map[netip.Addr]bool{}
	return func() string {
		for {
			a := netip.AddrFrom4([4]byte{byte(1 + rand.N(222)), byte(rand.N(256)), byte(rand.N(256)), byte(1 + rand.N(254))})
			if !seen[a] && !a.IsLoopback() && !a.IsPrivate() {
				seen[a] = true
				return a.String()
			}
		}
	}
}
