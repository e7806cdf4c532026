package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The tests here build the command and run it as a process, as a
// deployment does: configured by the environment, on loopback ports it
// picks (it logs them), on a real redis-server (internal/redistest) or its
// embedded Redis, stopped by SIGTERM.

var (
	binDir string // where the command is built
	build  = sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, "hybrid-rls")
		args := append(append([]string{"build"}, buildFlags...), "-o", bin, ".")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build: %v\n%s", err, out)
		}
		return bin, nil
	})
)

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "hybrid-rls-test"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// binary returns the path of the command, built once.
func binary(t *testing.T) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// proc is the command running as a process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	addrs  map[string]string // grpc, http, debug, from the log; set before served is closed
	mu     sync.Mutex        // protects logs
	logs   []map[string]any  // the JSON log lines
	raw    strings.Builder   // the log as written
	served chan struct{}     // closed when the process logs that it serves, after addrs is set
	exited chan struct{}     // closed when the process has exited and its log is read
	err    error             // Wait's, once exited is closed
}

// configDir writes the configuration file yaml into a runtime directory
// laid out as the original's deployments lay it out, and returns the
// environment that names it.
func configDir(t *testing.T, yaml string) []string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit"}
}

// run starts the command with env (and JSON logs), the loopback flags and
// args, and waits until it serves. At cleanup a process still running is
// sent SIGTERM, and must exit 0 within 20 s.
func run(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := startProc(t, env, args...)
	select {
	case <-p.served:
	case <-p.exited:
		t.Fatalf("hybrid-rls exited: %v\n%s", p.err, p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("hybrid-rls does not serve after 30s\n%s", p.log())
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("stopping hybrid-rls: %v\n%s", err, p.log())
		}
	})
	return p
}

// startProc starts the command with env and args, not waiting for it to
// serve.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-debug", "127.0.0.1:0"}, args...)...)
	cmd.Env = append([]string{"LOG_FORMAT=json"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, served: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		p.read(stderr)
		p.err = cmd.Wait()
	}()
	return p
}

// read reads the process's log until it closes, and closes p.served at
// the line that says it serves, with the addresses it gives.
func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		json.Unmarshal(sc.Bytes(), &line)
		p.mu.Lock()
		p.raw.WriteString(sc.Text() + "\n")
		if line != nil {
			p.logs = append(p.logs, line)
		}
		p.mu.Unlock()
		if line["@message"] == "serving" && p.addrs == nil {
			p.addrs = map[string]string{}
			for _, k := range []string{"grpc", "http", "debug"} {
				p.addrs[k], _ = line[k].(string)
			}
			close(p.served)
		}
	}
}

// find returns the first log line whose message is msg, nil if none.
func (p *proc) find(msg string) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.logs {
		if l["@message"] == msg {
			return l
		}
	}
	return nil
}

// log returns the log so far.
func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// stop sends SIGTERM to a process still running and waits for it: it must
// exit 0 within 20 s, after logging its stop.
func (p *proc) stop() error {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
			return errors.New("still running 20s after SIGTERM; killed")
		}
	}
	if p.err != nil {
		return p.err
	}
	if p.find("stopped") == nil {
		return errors.New(`exited 0 without logging "stopped"`)
	}
	return nil
}

// client returns a RateLimitService client of p, closed at cleanup.
func (p *proc) client(t *testing.T) rlspb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(p.addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

// metrics scrapes p's /metrics and returns the samples whose name starts
// with prefix, by name and labels as written.
func (p *proc) metrics(t *testing.T, prefix string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.addrs["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("malformed metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// request is a request of domain fleet for the descriptor api=shared.
func request() *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "fleet", Descriptors: []*extpb.RateLimitDescriptor{{
		Entries: []*extpb.RateLimitDescriptor_Entry{{Key: "api", Value: "shared"}},
	}}}
}

// fleetYAML is the limit of the fleet tests: 100 a second, a token bucket
// of burst B = 100 and rate R = 100/s.
const fleetYAML = `
domain: fleet
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 100}
`

// TestFleet runs 3 hybrid-rls processes on one redis-server and sends one
// descriptor through all of them over gRPC, 2 callers per process each
// calling every 20 ms (3 times the limit) for 2 s: together they admit at
// most B + R*T, T measured by Redis's clock (lease mode, the default, is
// exact for the fleet), and at least 80% of it, every process some, with
// no failed call. Their metrics count every call. SIGTERM then stops each
// process, which exits 0.
func TestFleet(t *testing.T) {
	rs := redistest.Server(t)
	clock := redistest.Client(t, rs)
	env := append(configDir(t, fleetYAML), "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rs.Addr())
	var procs []*proc
	var clients []rlspb.RateLimitServiceClient
	for range 3 {
		p := run(t, env)
		procs = append(procs, p)
		clients = append(clients, p.client(t))
	}
	// A first call on each connection, so that dialling is not in the run.
	for i, c := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "fleet", Descriptors: []*extpb.RateLimitDescriptor{{
			Entries: []*extpb.RateLimitDescriptor_Entry{{Key: "warm", Value: "up"}}}}})
		cancel()
		if err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}

	const (
		workers = 2
		period  = 20 * time.Millisecond
		runFor  = 2 * time.Second
		burst   = 100
		rate    = 100.0
	)
	t1, err := clock.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex // protects the counts below
		calls    = make([]int, len(clients))
		admitted = make([]int, len(clients))
		errs     []error
		wg       sync.WaitGroup
	)
	end := time.Now().Add(runFor)
	for i, c := range clients {
		for range workers {
			wg.Go(func() {
				tick := time.NewTicker(period) // paces the load
				defer tick.Stop()
				for now := range tick.C {
					if now.After(end) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					resp, err := c.ShouldRateLimit(ctx, request())
					cancel()
					mu.Lock()
					calls[i]++
					switch {
					case err != nil:
						errs = append(errs, err)
					case resp.GetOverallCode() == rlspb.RateLimitResponse_OK:
						admitted[i]++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t2, err := clock.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	total, totalCalls := 0, 0
	for i := range clients {
		total += admitted[i]
		totalCalls += calls[i]
	}
	window := t2.Sub(t1)
	ideal := burst + rate*window.Seconds()
	t.Logf("%d calls, %d admitted in %v (Redis TIME): B + R*T = %.1f, %.1f%% of it; per process %v of %v",
		totalCalls, total, window, ideal, 100*float64(total)/ideal, admitted, calls)
	if len(errs) > 0 {
		t.Errorf("%d calls failed; the first: %v", len(errs), errs[0])
	}
	if float64(total) > ideal {
		t.Errorf("admitted %d, more than B + R*T = %.1f", total, ideal)
	}
	if float64(total) < 0.8*ideal {
		t.Errorf("admitted %d, less than 80%% of B + R*T = %.1f", total, ideal)
	}
	for i, n := range admitted {
		if n == 0 {
			t.Errorf("process %d admitted nothing", i)
		}
	}
	for i, p := range procs {
		m := p.metrics(t, "ratelimit_service_rate_limit_")
		labels := `{domain="fleet",key1="api",key2=""}` // matched by its key: the value is not in the stats key
		hits, over := m["ratelimit_service_rate_limit_total_hits"+labels], m["ratelimit_service_rate_limit_over_limit"+labels]
		if int(hits) != calls[i] || int(hits-over) != admitted[i] {
			t.Errorf("process %d: metrics say %v hits, %v over the limit; it was sent %d and admitted %d", i, hits, over, calls[i], admitted[i])
		}
	}
}

// TestEmbedded: with no Redis configured the command starts its embedded
// Redis, says so, and limits with it; /json answers.
func TestEmbedded(t *testing.T) {
	// The first decision of a process just started makes its first Redis
	// calls (a connection, the scripts loaded): under -race on loaded
	// cores that once took longer than the default ColdWait (50 ms), and
	// the request was denied unanswered, as documented. This test is about
	// the embedded Redis answering, not about that wait.
	p := run(t, configDir(t, fleetYAML), "-cold-wait", "10s")
	warn := p.find("no Redis given (REDIS_URL unset, no -redis): buckets are kept in an embedded, in-memory Redis; " +
		"the limits hold for this process alone and are lost when it stops")
	if warn == nil || warn["level"] != "warning" {
		t.Errorf("no warning about the embedded Redis:\n%s", p.log())
	}
	body := `{"domain":"fleet","descriptors":[{"entries":[{"key":"api","value":"json"}]}]}`
	resp, err := http.Post("http://"+p.addrs["http"]+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"overallCode":"OK"`) {
		t.Errorf("POST /json = %d %s", resp.StatusCode, out)
	}
}

// TestBadSettings: a setting that does not parse stops the command with
// exit status 2 and a message naming it.
func TestBadSettings(t *testing.T) {
	for _, env := range [][]string{
		{"PORT=http"},
		{"BACKEND_TYPE=memcache"},
		{"RUNTIME_ROOT=/does/not/exist"},
	} {
		p := startProc(t, env)
		<-p.exited
		var exit *exec.ExitError
		name, _, _ := strings.Cut(env[0], "=")
		if !errors.As(p.err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want status 2\n%s", env, p.err, p.log())
		} else if !strings.Contains(p.log(), name) && !strings.Contains(p.log(), "configuration directory") {
			t.Errorf("%v: the message does not name %s:\n%s", env, name, p.log())
		}
	}
}

// TestSIGTERM: SIGTERM stops the command in order (unhealthy, drained,
// the Limiter closed) and it exits 0.
func TestSIGTERM(t *testing.T) {
	p := run(t, configDir(t, fleetYAML))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.client(t).ShouldRateLimit(ctx, request()); err != nil {
		t.Fatal(err)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("%v\n%s", err, p.log())
	}
	var order []string
	for _, msg := range []string{"shutting down", "draining", "servers stopped", "hybrid: closed", "stopped"} {
		p.mu.Lock()
		for i, l := range p.logs {
			if l["@message"] == msg {
				order = append(order, fmt.Sprintf("%d:%s", i, msg))
				break
			}
		}
		p.mu.Unlock()
	}
	if len(order) != 5 {
		t.Fatalf("log lines of the stop %v, want all five\n%s", order, p.log())
	}
	last := -1
	for _, o := range order {
		i, _ := strconv.Atoi(strings.SplitN(o, ":", 2)[0])
		if i < last {
			t.Errorf("stop out of order: %v", order)
		}
		last = i
	}
}
