package runner_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/runner"
	"github.com/hybridlimit/hybrid/internal/logbuf"
)

// TestMain silences go-redis's own log.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// loadEvent is one call of Config.OnLoad.
type loadEvent struct {
	rules *config.Rules
	err   error
}

// svc is a Service started by a test on loopback ports, with clients of
// its ports.
type svc struct {
	t     *testing.T
	s     *runner.Service
	dir   string
	rls   rlspb.RateLimitServiceClient
	conn  *grpc.ClientConn
	http  *http.Client
	logs  *logbuf.Buffer
	loads chan loadEvent // every load after the first
	close func() error   // Close, once; the test's cleanup calls it too
}

// testYAML is the configuration of most tests: 3 a minute for k=v, decided
// by Redis (exact mode: every decision is a script call, so the sequence
// of answers is the same every run), and 100 a minute per value of ip,
// detailed in the stats.
const testYAML = `
domain: test
descriptors:
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 3, mode: exact}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100, mode: exact}
`

// start starts a Service on 127.0.0.1:0 ports with an embedded Redis,
// its configuration directory holding config.yaml with the content yaml
// ("" for none), after mutate (if not nil) has changed its Config. The
// Service is closed when t ends. Redis's calls have generous deadlines:
// under the race detector an in-process Redis answers late, and a slow
// Redis denies rather than decide.
func start(t *testing.T, yaml string, mutate func(*runner.Config)) *svc {
	t.Helper()
	dir := t.TempDir()
	if yaml != "" {
		writeFile(t, dir, "config.yaml", yaml)
	}
	v := &svc{t: t, dir: dir, logs: new(logbuf.Buffer), loads: make(chan loadEvent, 64)}
	first := true
	cfg := runner.Config{
		GRPCAddr:       "127.0.0.1:0",
		HTTPAddr:       "127.0.0.1:0",
		DebugAddr:      "127.0.0.1:0",
		ConfigDir:      dir,
		ReloadInterval: 10 * time.Millisecond,
		RedisTimeout:   10 * time.Second,
		ColdWait:       10 * time.Second,
		OnLoad: func(r *config.Rules, err error) {
			if first {
				first = false
				return
			}
			select {
			case v.loads <- loadEvent{r, err}:
			default:
				t.Errorf("more loads than the test reads")
			}
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.Logger = cfg.NewLogger(v.logs)
	s, err := runner.Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v\nlog:\n%s", err, v.logs)
	}
	v.s = s
	v.close = sync.OnceValue(s.Close)
	v.conn, err = grpc.NewClient(s.Addrs().GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	v.rls = rlspb.NewRateLimitServiceClient(v.conn)
	tr := &http.Transport{}
	v.http = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		v.conn.Close()
		tr.CloseIdleConnections()
		if err := v.close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if t.Failed() {
			t.Logf("service log:\n%s", v.logs)
		}
	})
	return v
}

// writeFile writes content to dir/name.
func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nextLoad waits for the next load of the configuration.
func (v *svc) nextLoad() loadEvent {
	v.t.Helper()
	select {
	case e := <-v.loads:
		return e
	case <-time.After(30 * time.Second):
		v.t.Fatal("no load of the configuration within 30s")
		return loadEvent{}
	}
}

// call makes one ShouldRateLimit call, failing the test on an error.
func (v *svc) call(domain string, kv ...string) *rlspb.RateLimitResponse {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := v.rls.ShouldRateLimit(ctx, request(domain, kv...))
	if err != nil {
		v.t.Fatalf("ShouldRateLimit(%s %v): %v", domain, kv, err)
	}
	return resp
}

// request builds a request of one descriptor from key, value pairs.
func request(domain string, kv ...string) *rlspb.RateLimitRequest {
	d := &extpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &extpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*extpb.RateLimitDescriptor{d}}
}

// get sends GET url and returns the status and the body.
func (v *svc) get(url string) (int, string) {
	v.t.Helper()
	return v.do(http.MethodGet, url, "")
}

// do sends a request and returns the status and the body.
func (v *svc) do(method, url, body string) (int, string) {
	v.t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		v.t.Fatal(err)
	}
	resp, err := v.http.Do(req)
	if err != nil {
		v.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		v.t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}

// metrics scrapes /metrics and returns the samples by name and labels as
// written: `ratelimit_service_config_load_success`,
// `ratelimit_service_rate_limit_total_hits{domain="test",key1="k_v",key2=""}`.
func (v *svc) metrics() map[string]float64 {
	v.t.Helper()
	code, body := v.get("http://" + v.s.Addrs().HTTP + "/metrics")
	if code != http.StatusOK {
		v.t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return parseMetrics(v.t, body)
}

// parseMetrics parses the text exposition format's samples.
func parseMetrics(t testing.TB, body string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("malformed metrics line %q", line)
		}
		f, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("malformed metrics line %q", line)
		}
		out[line[:i]] = f
	}
	return out
}

// discard returns a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
