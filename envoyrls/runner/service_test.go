package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/runner"
)

// codes returns the overall codes of n calls for k=v.
func (v *svc) codes(n int) []rlspb.RateLimitResponse_Code {
	v.t.Helper()
	var out []rlspb.RateLimitResponse_Code
	for range n {
		out = append(out, v.call("test", "k", "v").GetOverallCode())
	}
	return out
}

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

// TestEmbeddedRedis: with no Redis given, the service starts an embedded
// one, says so in its log, and limits with it.
func TestEmbeddedRedis(t *testing.T) {
	v := start(t, testYAML, nil)
	got := v.codes(5)
	want := []rlspb.RateLimitResponse_Code{ok, ok, ok, over, over}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("codes %v, want %v", got, want)
		}
	}
	if log := v.logs.String(); !strings.Contains(log, "embedded, in-memory Redis") || !strings.Contains(log, "level=WARN") {
		t.Errorf("no warning about the embedded Redis in the log:\n%s", log)
	}
}

// TestHealthcheck: /healthcheck answers OK while serving.
func TestHealthcheck(t *testing.T) {
	v := start(t, testYAML, nil)
	code, body := v.get("http://" + v.s.Addrs().HTTP + "/healthcheck")
	if code != http.StatusOK || body != "OK" {
		t.Errorf("GET /healthcheck = %d %q, want 200 \"OK\"", code, body)
	}
	hc := healthpb.NewHealthClient(v.conn)
	for _, name := range []string{"", "ratelimit"} {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("gRPC health %q: %v, %v; want SERVING", name, resp.GetStatus(), err)
		}
	}
}

// TestHealthyWithConfig: with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, the
// service is unhealthy until a configuration with a domain is loaded.
func TestHealthyWithConfig(t *testing.T) {
	v := start(t, "", func(c *runner.Config) { c.HealthyWithConfig = true })
	url := "http://" + v.s.Addrs().HTTP + "/healthcheck"
	hc := healthpb.NewHealthClient(v.conn)
	check := func(wantHTTP int, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		if code, _ := v.get(url); code != wantHTTP {
			t.Errorf("GET /healthcheck = %d, want %d", code, wantHTTP)
		}
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil || resp.GetStatus() != want {
			t.Errorf("gRPC health: %v, %v; want %v", resp.GetStatus(), err, want)
		}
	}
	check(http.StatusInternalServerError, healthpb.HealthCheckResponse_NOT_SERVING)
	writeFile(t, v.dir, "config.yaml", testYAML)
	if e := v.nextLoad(); e.err != nil {
		t.Fatalf("load: %v", e.err)
	}
	check(http.StatusOK, healthpb.HealthCheckResponse_SERVING)
}

// TestJSON: /json answers as the original's does.
func TestJSON(t *testing.T) {
	v := start(t, testYAML, nil)
	url := "http://" + v.s.Addrs().HTTP + "/json"
	const kv = `{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	for i, c := range []struct {
		method, body string
		code         int
		overall      string // "" for a body that is not JSON
		remaining    float64
	}{
		{"POST", kv, 200, "OK", 2},
		{"POST", kv, 200, "OK", 1},
		{"GET", kv, 200, "OK", 0}, // any method, as the original
		{"POST", kv, 429, "OVER_LIMIT", 0},
		{"POST", `{"domain":"test","descriptors":[{"entries":[{"key":"other","value":"x"}]}]}`, 200, "OK", 0},
		{"POST", `{"domain":"", "descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, 400, "", 0},
		{"POST", `{"domain":"test"}`, 400, "", 0},
		{"POST", `not json`, 400, "", 0},
		{"POST", `{"domain":"test","unknownField":1}`, 400, "", 0},
	} {
		code, body := v.do(c.method, url, c.body)
		if code != c.code {
			t.Errorf("%d: %s %s = %d %s, want %d", i, c.method, c.body, code, body, c.code)
			continue
		}
		if c.overall == "" {
			if body != "Bad Request\n" {
				t.Errorf("%d: body %q, want \"Bad Request\\n\"", i, body)
			}
			continue
		}
		var resp struct {
			OverallCode string
			Statuses    []struct {
				Code           string
				LimitRemaining float64
			}
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%d: body %s: %v", i, body, err)
		}
		if resp.OverallCode != c.overall || len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != c.remaining {
			t.Errorf("%d: %s, want overallCode %s and limitRemaining %v", i, body, c.overall, c.remaining)
		}
	}
}

// TestMetrics: /metrics has the per-descriptor counters under the
// original's names, and they count the calls; the configuration loads,
// the gRPC calls and the Limiter's metrics are there too.
func TestMetrics(t *testing.T) {
	v := start(t, testYAML, nil)
	v.codes(5)
	v.call("test", "ip", "10.1.2.3")
	v.call("nowhere", "k", "v")
	m := v.metrics()
	for name, want := range map[string]float64{
		`ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v",key2=""}`:         5,
		`ratelimit_service_rate_limit_within_limit{domain="test",key1="k_v",key2=""}`:       3,
		`ratelimit_service_rate_limit_over_limit{domain="test",key1="k_v",key2=""}`:         2,
		`ratelimit_service_rate_limit_near_limit{domain="test",key1="k_v",key2=""}`:         1,
		`ratelimit_service_rate_limit_shadow_mode{domain="test",key1="k_v",key2=""}`:        0,
		`ratelimit_service_rate_limit_total_hits{domain="test",key1="ip_10_1_2_3",key2=""}`: 1,
		`ratelimit_service_rate_limit_domain_not_found{domain="nowhere"}`:                   1,
		`ratelimit_service_config_load_success`:                                             1,
		`ratelimit_service_config_load_error`:                                               0,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:                   7,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`:      7,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"}`:               0,
		`hybrid_rls_calls_total{outcome="answered"}`:                                        7,
		`hybrid_rls_over_limit_responses_total`:                                             2,
		`hybrid_rls_stats_series`:                                                           2,
		`hybrid_rls_config_domains`:                                                         1,
	} {
		if got, found := m[name]; !found || got != want {
			t.Errorf("%s = %v (found %v), want %v", name, got, found, want)
		}
	}
	for _, name := range []string{`hybrid_decisions_total{result="allowed",source="redis"}`, "go_goroutines"} {
		if _, found := m[name]; !found {
			t.Errorf("no %s", name)
		}
	}
	// The counts move.
	v.call("test", "k", "v")
	if got := v.metrics()[`ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v",key2=""}`]; got != 6 {
		t.Errorf("total_hits after one more call = %v, want 6", got)
	}
}

// TestMaxSeries: label sets past the bound count under an empty domain.
func TestMaxSeries(t *testing.T) {
	v := start(t, testYAML, func(c *runner.Config) { c.MaxSeries = 2 })
	for _, ip := range []string{"a", "b", "c", "d"} {
		v.call("test", "ip", ip)
	}
	m := v.metrics()
	for name, want := range map[string]float64{
		`ratelimit_service_rate_limit_total_hits{domain="test",key1="ip_a",key2=""}`: 1,
		`ratelimit_service_rate_limit_total_hits{domain="test",key1="ip_b",key2=""}`: 1,
		`ratelimit_service_rate_limit_total_hits{domain="",key1="",key2=""}`:         2,
		`hybrid_rls_stats_series`: 2,
	} {
		if got := m[name]; got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// TestRLConfig: the debug port's /rlconfig prints the configuration in
// force, and / lists the debug pages.
func TestRLConfig(t *testing.T) {
	v := start(t, testYAML, nil)
	rules, err := config.Load([]config.File{{Name: "config.yaml", Data: []byte(testYAML)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	debug := "http://" + v.s.Addrs().Debug
	if code, body := v.get(debug + "/rlconfig"); code != 200 || body != rules.Dump() {
		t.Errorf("GET /rlconfig = %d %q, want 200 %q", code, body, rules.Dump())
	}
	if !strings.Contains(rules.Dump(), "test.k_v: unit=MINUTE requests_per_unit=3") {
		t.Errorf("Dump %q lacks the limit", rules.Dump())
	}
	_, index := v.get(debug + "/")
	for _, want := range []string{"/rlconfig: ", "/debug/pprof/: ", "/stats: "} {
		if !strings.Contains(index, want) {
			t.Errorf("debug index %q lacks %q", index, want)
		}
	}
	if code, body := v.get(debug + "/stats"); code != 200 || !strings.Contains(body, "memstats: ") {
		t.Errorf("GET /stats = %d, %.80q", code, body)
	}
}

// TestReload: a changed file takes effect while the service serves; a
// file the loader refuses is logged and counted, and the rules in force
// stay.
func TestReload(t *testing.T) {
	v := start(t, testYAML, nil)
	limit := func() uint32 {
		return v.call("test", "k", "v").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 3 {
		t.Fatalf("limit %d, want 3", got)
	}
	writeFile(t, v.dir, "config.yaml", strings.Replace(testYAML, "requests_per_unit: 3,", "requests_per_unit: 10,", 1))
	if e := v.nextLoad(); e.err != nil {
		t.Fatalf("reload: %v", e.err)
	}
	if got := limit(); got != 10 {
		t.Errorf("limit after the reload %d, want 10", got)
	}
	if _, body := v.get("http://" + v.s.Addrs().Debug + "/rlconfig"); !strings.Contains(body, "requests_per_unit=10") {
		t.Errorf("/rlconfig after the reload: %q", body)
	}

	// A second file with the same domain is refused.
	writeFile(t, v.dir, "more.yaml", "domain: test\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	e := v.nextLoad()
	var cerr *config.Error
	if !errors.As(e.err, &cerr) || !errors.Is(e.err, config.ErrDuplicateDomain) || cerr.Domain != "test" || cerr.File == "" {
		t.Fatalf("load of a duplicate domain: %v, want a config.Error of ErrDuplicateDomain naming the file and domain test", e.err)
	}
	if e.rules == nil || !strings.Contains(e.rules.Dump(), "requests_per_unit=10") {
		t.Errorf("rules in force after the refusal: %v", e.rules)
	}
	if got := limit(); got != 10 {
		t.Errorf("limit after a refused file %d, want 10", got)
	}
	m := v.metrics()
	if m["ratelimit_service_config_load_error"] != 1 || m["ratelimit_service_config_load_success"] != 2 {
		t.Errorf("config loads: success %v, error %v; want 2 and 1",
			m["ratelimit_service_config_load_success"], m["ratelimit_service_config_load_error"])
	}
	if log := v.logs.String(); !strings.Contains(log, "configuration refused") || !strings.Contains(log, "duplicate domain") {
		t.Errorf("no refusal in the log:\n%s", log)
	}
}

// TestStartErrors: a missing directory and a port in use stop Start, and
// release what it opened.
func TestStartErrors(t *testing.T) {
	_, err := runner.Start(runner.Config{ConfigDir: t.TempDir() + "/none", Logger: discard()})
	if !errors.Is(err, runner.ErrConfig) {
		t.Errorf("Start with a missing directory: %v, want ErrConfig", err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := runner.Config{
		ConfigDir: t.TempDir(),
		GRPCAddr:  "127.0.0.1:0",
		HTTPAddr:  "127.0.0.1:0",
		DebugAddr: busy.Addr().String(),
		Logger:    discard(),
	}
	if _, err := runner.Start(cfg); err == nil || !strings.Contains(err.Error(), "debug") {
		t.Errorf("Start with the debug port taken: %v", err)
	}
}

// TestDrain: Close makes the service unhealthy at once, lets the call
// under way finish with its answer, and then stops.
func TestDrain(t *testing.T) {
	entered := make(chan struct{}, 1)
	gate := make(chan struct{})
	v := start(t, testYAML, func(c *runner.Config) {
		runner.SetHold(c, func() {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-gate
		})
	})
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := healthpb.NewHealthClient(v.conn).Watch(watchCtx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch: %v, %v; want SERVING", st.GetStatus(), err)
	}

	answered := make(chan error, 1)
	go func() {
		resp, err := v.rls.ShouldRateLimit(context.Background(), request("test", "k", "v"))
		if err == nil && resp.GetOverallCode() != ok {
			err = errors.New(resp.GetOverallCode().String())
		}
		answered <- err
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- v.close() }()

	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health watch after Close: %v, %v; want NOT_SERVING", st.GetStatus(), err)
	}
	if code, _ := v.get("http://" + v.s.Addrs().HTTP + "/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("GET /healthcheck while draining = %d, want 500", code)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a call under way", err)
	default:
	}
	stopWatch()
	close(gate)
	if err := <-answered; err != nil {
		t.Errorf("the call under way: %v, want an OK answer", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	conn, err := net.DialTimeout("tcp", v.s.Addrs().GRPC, time.Second)
	if err == nil {
		conn.Close()
		t.Errorf("the gRPC port still accepts connections after Close")
	}
	for _, want := range []string{"msg=draining", "msg=stopped"} {
		if !strings.Contains(v.logs.String(), want) {
			t.Errorf("no %q in the log", want)
		}
	}
}

// TestIgnoredLogged: the original's settings the service does not apply
// are named in its log.
func TestIgnoredLogged(t *testing.T) {
	v := start(t, testYAML, func(c *runner.Config) { c.Ignored = []string{"REDIS_PERSECOND", "USE_STATSD"} })
	if log := v.logs.String(); !strings.Contains(log, "REDIS_PERSECOND,USE_STATSD") {
		t.Errorf("the ignored settings are not in the log:\n%s", log)
	}
}

// TestStartInvalidConfig: a configuration the loader refuses at start is
// logged and counted, the service answers with the original's error for a
// missing configuration (gRPC's Unknown; 400 on /json) until the files are
// fixed, and then serves them.
func TestStartInvalidConfig(t *testing.T) {
	v := start(t, "domain: test\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n", nil)
	_, err := v.rls.ShouldRateLimit(t.Context(), request("test", "k", "v"))
	if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
		t.Errorf("ShouldRateLimit with no configuration: %v, want Unknown: no rate limit configuration loaded", err)
	}
	if code, _ := v.do("POST", "http://"+v.s.Addrs().HTTP+"/json", `{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`); code != 400 {
		t.Errorf("POST /json with no configuration = %d, want 400", code)
	}
	if got := v.metrics()["ratelimit_service_config_load_error"]; got != 1 {
		t.Errorf("config_load_error = %v, want 1", got)
	}
	if code, body := v.get("http://" + v.s.Addrs().Debug + "/rlconfig"); code != 200 || body != "" {
		t.Errorf("GET /rlconfig with no configuration = %d %q, want 200 and nothing", code, body)
	}
	writeFile(t, v.dir, "config.yaml", testYAML)
	if e := v.nextLoad(); e.err != nil {
		t.Fatalf("load of the fixed file: %v", e.err)
	}
	if got := v.call("test", "k", "v").GetOverallCode(); got != ok {
		t.Errorf("code after the fix %v, want OK", got)
	}
}

// TestPrometheusPort: with USE_PROMETHEUS, /metrics is served on its own
// port too, at PROMETHEUS_PATH.
func TestPrometheusPort(t *testing.T) {
	v := start(t, testYAML, func(c *runner.Config) {
		c.PrometheusAddr, c.PrometheusPath = "127.0.0.1:0", "/prom"
	})
	v.call("test", "k", "v")
	code, body := v.get("http://" + v.s.Addrs().Prometheus + "/prom")
	if code != 200 || !strings.Contains(body, `ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v",key2=""} 1`) {
		t.Errorf("GET /prom on the Prometheus port = %d, %d bytes without the hits of k_v", code, len(body))
	}
	if code, _ := v.get("http://" + v.s.Addrs().Prometheus + "/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics on the Prometheus port = %d, want 404", code)
	}
}

// TestUnixSocket: GRPC_UDS, "unix:/path", serves gRPC on a Unix socket.
func TestUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/rl.sock"
	v := start(t, testYAML, func(c *runner.Config) { c.GRPCAddr = "unix:" + sock })
	if got := v.s.Addrs().GRPC; got != "unix:"+sock {
		t.Errorf("Addrs().GRPC = %q, want unix:%s", got, sock)
	}
	if got := v.codes(1); got[0] != ok {
		t.Errorf("code %v over the Unix socket, want OK", got[0])
	}
}

// TestIndependent: Config.Independent (the -independent flag) reaches the
// service. A request of a descriptor limited to 3 a minute and one limited
// to 1 is refused from its second call on; all or nothing (the default)
// spends neither limit then, so the first still holds 2 tokens, while the
// original's way spends it at every call, and it is empty after three.
func TestIndependent(t *testing.T) {
	const yaml = `
domain: test
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3, mode: exact}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1, mode: exact}
`
	for _, independent := range []bool{false, true} {
		v := start(t, yaml, func(c *runner.Config) { c.Independent = independent })
		both := request("test", "a", "x")
		both.Descriptors = append(both.Descriptors, request("test", "b", "x").Descriptors...)
		for i, want := range []rlspb.RateLimitResponse_Code{ok, over, over} {
			resp, err := v.rls.ShouldRateLimit(t.Context(), both)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetOverallCode(); got != want {
				t.Fatalf("Independent %v: call %d of both: %v, want %v", independent, i+1, got, want)
			}
		}
		resp := v.call("test", "a", "x")
		wantCode, wantLeft := ok, uint32(1)
		if independent {
			wantCode, wantLeft = over, 0
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != wantCode || st.GetLimitRemaining() != wantLeft {
			t.Errorf("Independent %v: a alone after three calls of both: %v with %d remaining, want %v with %d", independent, resp.GetOverallCode(), st.GetLimitRemaining(), wantCode, wantLeft)
		}
	}
}
