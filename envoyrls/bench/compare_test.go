package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/hybrid/internal/logbuf"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The environment of the comparison; doc.go describes each.
const (
	envRun         = "HYBRID_RLS_BENCH"
	envOriginalSrc = "HYBRID_RLS_ORIGINAL_SRC"
	envOriginalBin = "HYBRID_RLS_ORIGINAL_BIN"
	envDuration    = "HYBRID_RLS_BENCH_DURATION"
	envRepeats     = "HYBRID_RLS_BENCH_REPEATS"
	envWorkers     = "HYBRID_RLS_BENCH_WORKERS"
	envRTT         = "HYBRID_RLS_BENCH_RTT"
	envUsers       = "HYBRID_RLS_BENCH_USERS"
	envCPUs        = "HYBRID_RLS_BENCH_CPUS"
	envFloor       = "HYBRID_RLS_BENCH_FLOOR"

	// envProxy makes the test binary the latency proxy (runProxy): its
	// value is the Redis address, envProxyRTT the round trip to add.
	envProxy    = "HYBRID_RLS_BENCH_PROXY"
	envProxyRTT = "HYBRID_RLS_BENCH_PROXY_RTT"
	// envFloorServe makes the test binary the gRPC floor (runFloor).
	envFloorServe = "HYBRID_RLS_BENCH_FLOOR_SERVE"
)

// The limits of the configuration both services load.
const (
	domain     = "bench"
	hotLimit   = 10000 // a second, for route=/api
	userLimit  = 10    // a minute, for each user=<id>
	configYAML = `domain: bench
descriptors:
  - key: route
    value: /api
    rate_limit: {unit: second, requests_per_unit: 10000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`
)

// The workloads.
const (
	workloadHot  = "A hot"
	workloadTail = "B tail"
)

func TestMain(m *testing.M) {
	if target := os.Getenv(envProxy); target != "" {
		if err := runProxy(target, os.Getenv(envProxyRTT)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(envFloorServe) != "" {
		if err := runFloor(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// settings are the comparison's, from the environment.
type settings struct {
	originalSrc, originalBin string
	duration                 time.Duration
	repeats, workers, users  int
	rtts                     []time.Duration
	split                    bool // the load and the services on processors of their own (envCPUs)
	floor                    bool // the gRPC floor beside the services (envFloor)
}

// settingsFromEnv reads the settings, with their defaults.
func settingsFromEnv() (settings, error) {
	s := settings{
		originalSrc: os.Getenv(envOriginalSrc),
		originalBin: os.Getenv(envOriginalBin),
		duration:    5 * time.Second,
		repeats:     2,
		workers:     32,
		users:       100000,
		rtts:        []time.Duration{0, time.Millisecond},
	}
	if s.originalSrc == "" && s.originalBin == "" {
		return s, fmt.Errorf("bench: set %s to the original's source (git clone https://github.com/envoyproxy/ratelimit) or %s to its binary", envOriginalSrc, envOriginalBin)
	}
	if v := os.Getenv(envDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("bench: %s=%q: want a positive duration", envDuration, v)
		}
		s.duration = d
	}
	for _, e := range []struct {
		name string
		to   *int
	}{{envRepeats, &s.repeats}, {envWorkers, &s.workers}, {envUsers, &s.users}} {
		v := os.Getenv(e.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return s, fmt.Errorf("bench: %s=%q: want a positive integer", e.name, v)
		}
		*e.to = n
	}
	var err error
	if s.split, err = envSwitch(envCPUs, "shared", "split"); err != nil {
		return s, err
	}
	if s.floor, err = envSwitch(envFloor, "0", "1"); err != nil {
		return s, err
	}
	if v := os.Getenv(envRTT); v != "" {
		s.rtts = nil
		for f := range strings.SplitSeq(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil || d < 0 {
				return s, fmt.Errorf("bench: %s=%q: want durations, 0 for none", envRTT, v)
			}
			s.rtts = append(s.rtts, d)
		}
	}
	return s, nil
}

// envSwitch reads the environment variable name, which is off (or unset)
// or on.
func envSwitch(name, off, on string) (bool, error) {
	switch v := os.Getenv(name); v {
	case "", off:
		return false, nil
	case on:
		return true, nil
	default:
		return false, fmt.Errorf("bench: %s=%q: want %s or %s", name, v, off, on)
	}
}

// TestCompare runs both services on every workload and round trip, and
// prints the table. It skips unless HYBRID_RLS_BENCH=1.
func TestCompare(t *testing.T) {
	s, bin, env := prepare(t, "to compare hybrid-rls with envoyproxy/ratelimit")
	cpus := "shared by the load, the services and Redis"
	var sp *split
	if s.split {
		var err error
		if sp, err = newSplit(); err != nil {
			t.Fatal(err)
		}
		restore, err := sp.pinSelf()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(restore)
		cpus = sp.String()
	}

	srv, err := redistest.Start(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if sp != nil {
		if err := sp.pinService(srv.Pid()); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: redistest.LoopbackDialer(5 * time.Second)})
	t.Cleanup(func() { rdb.Close() })

	var results []Result
	for _, rtt := range s.rtts {
		addr := srv.Addr()
		if rtt > 0 {
			addr = startProxy(t, srv.Addr(), rtt)
			t.Logf("redis through a proxy adding %v: PING %v (direct %v)", rtt, pingTime(t, addr), pingTime(t, srv.Addr()))
		}
		for _, workload := range []string{workloadHot, workloadTail} {
			for rep := range s.repeats {
				order := []string{serviceOriginal, serviceHybrid}
				if s.floor {
					order = append(order, serviceFloor)
				}
				if rep%2 == 1 {
					slices.Reverse(order)
				}
				for _, name := range order {
					r := runCell(t, s, rdb, cell{
						service: name, bin: bin[name], env: env, redis: addr,
						workload: workload, rtt: rtt, repeat: rep, cpus: sp,
					})
					t.Logf("%s %s %s run %d: %.0f decisions/s, %d OK, %d OVER_LIMIT, %d errors",
						rttName(rtt), workload, name, rep+1, r.Rate(), r.OK, r.OverLimit, r.Errors)
					results = append(results, r)
				}
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers, %v a cell, GOMAXPROCS of the load %d, %d cores, %s\n\n", s.workers, s.duration, runtime.GOMAXPROCS(0), runtime.NumCPU(), cpus)
	if err := WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// prepare skips t, saying it would run what, unless HYBRID_RLS_BENCH=1;
// else it reads the settings, builds both services and writes the
// configuration, and returns the settings, each service's binary by name
// and the environment that names the configuration.
func prepare(t *testing.T, what string) (settings, map[string]string, []string) {
	t.Helper()
	if os.Getenv(envRun) != "1" {
		t.Skipf("set %s=1 (and %s) %s", envRun, envOriginalSrc, what)
	}
	s, err := settingsFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	bins := t.TempDir()
	bin := map[string]string{
		serviceOriginal: buildOriginal(t, s, bins),
		serviceHybrid:   buildHybrid(t, bins),
		serviceFloor:    os.Args[0], // runFloor, through TestMain
	}
	return s, bin, configEnv(t)
}

// connect opens the load's 4 connections to p and waits until p answers;
// closeAll closes them.
func connect(t *testing.T, p *service) (conns []*grpc.ClientConn, closeAll func()) {
	t.Helper()
	closeAll = func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	for range 4 {
		cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			t.Fatal(err)
		}
		conns = append(conns, cc)
	}
	p.waitServing(t, rlspb.NewRateLimitServiceClient(conns[0]))
	return conns, closeAll
}

// buildOriginal returns the original's binary: HYBRID_RLS_ORIGINAL_BIN, or
// built from HYBRID_RLS_ORIGINAL_SRC into dir.
func buildOriginal(t *testing.T, s settings, dir string) string {
	t.Helper()
	if s.originalBin != "" {
		return s.originalBin
	}
	bin := filepath.Join(dir, "ratelimit")
	cmd := exec.Command("go", "build", "-o", bin, "./src/service_cmd")
	cmd.Dir = s.originalSrc
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the original in %s: %v\n%s", s.originalSrc, err, out)
	}
	return bin
}

// buildHybrid builds envoyrls/cmd/hybrid-rls into dir.
func buildHybrid(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "hybrid-rls")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/hybrid-rls")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building hybrid-rls: %v\n%s", err, out)
	}
	return bin
}

// configEnv writes the configuration as the original's deployments lay
// it out and returns the environment that names it, for both services.
func configEnv(t *testing.T) []string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(configYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false",
		"LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp",
	}
}

// cell is one service's run of one workload.
type cell struct {
	service, bin string
	env          []string
	redis        string // the address the service reaches Redis at
	workload     string
	rtt          time.Duration
	repeat       int
	cpus         *split // the processors to pin the service to; nil: shared
}

// runCell empties Redis, starts the service, drives it for s.duration
// and stops it. Redis's commands are counted from the first call of the
// load to its last answer.
func runCell(t *testing.T, s settings, rdb *redis.Client, c cell) Result {
	t.Helper()
	ctx := context.Background()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p := startService(t, c)
	defer p.stop(t)
	conns, closeAll := connect(t, p)
	defer closeAll()
	if c.cpus != nil {
		// Again, now that it serves: threads its start made while it was
		// first pinned may have kept the load's processors.
		if err := c.cpus.pinService(p.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}

	before, cpuBefore := redisStats(t, rdb)
	svcBefore, svcErr := procCPU(p.cmd.Process.Pid)
	loadBefore := selfCPU()
	r := drive(conns, s, c)
	r.LoadCPU = selfCPU() - loadBefore
	if svcAfter, err := procCPU(p.cmd.Process.Pid); err == nil && svcErr == nil {
		r.ServiceCPU = svcAfter - svcBefore
	}
	after, cpuAfter := redisStats(t, rdb)
	var byCommand map[string]int64
	byCommand, r.RedisCalls = callsSince(before, after)
	r.ScriptCalls = scriptCalls(byCommand)
	r.RedisCPU = cpuAfter - cpuBefore
	t.Logf("%s %s %s run %d: redis commands %v", rttName(c.rtt), c.workload, c.service, c.repeat+1, byCommand)
	if r.Errors > 0 {
		t.Logf("%s: %d errors, the first: %v", c.service, r.Errors, r.firstErr)
	}
	return r.Result
}

// redisStats returns the calls of each command Redis has run, the
// bench's own left out, and its CPU time.
func redisStats(t *testing.T, rdb *redis.Client) (map[string]int64, time.Duration) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, err := commandCalls(info)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := cpuTime(info)
	if err != nil {
		t.Fatal(err)
	}
	return calls, cpu
}

// service is a service running as a process.
type service struct {
	name   string
	cmd    *exec.Cmd
	grpc   string
	log    *logbuf.Buffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// startService starts c's service on free loopback ports.
func startService(t *testing.T, c cell) *service {
	t.Helper()
	ports := freePorts(t, 3)
	cmd := exec.Command(c.bin)
	if c.service == serviceFloor {
		cmd.Args = append(cmd.Args, "-test.run=^$")
		cmd.Env = append(cmd.Env, envFloorServe+"=1")
	}
	cmd.Env = append(cmd.Env, c.env...)
	cmd.Env = append(cmd.Env,
		"REDIS_URL="+c.redis,
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]),
		"PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"),
	)
	if c.cpus != nil {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(c.cpus.serviceProcs()))
	}
	p := &service{name: c.service, cmd: cmd, grpc: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])), log: &logbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", c.service, err)
	}
	if c.cpus != nil {
		if err := c.cpus.pinService(cmd.Process.Pid); err != nil {
			cmd.Process.Kill()
			t.Fatalf("pinning %s: %v", c.service, err)
		}
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p
}

// waitServing calls the service until it answers: a descriptor no limit
// applies to, which neither service takes to Redis.
func (p *service) waitServing(t *testing.T, client rlspb.RateLimitServiceClient) {
	t.Helper()
	req := request("probe", "1")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil && resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer after 30s: %v\n%s", p.name, err, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the process, killing it after 20 s.
func (p *service) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s still running 20s after SIGTERM; killed\n%s", p.name, p.log)
	}
}

// freePorts returns n distinct free ports of 127.0.0.1. Another process
// may take one before the service binds it; the service then fails to
// start, and says so.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// request is a ShouldRateLimit of one descriptor of one entry.
func request(key, value string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{
		Domain:      domain,
		Descriptors: []*extpb.RateLimitDescriptor{{Entries: []*extpb.RateLimitDescriptor_Entry{{Key: key, Value: value}}}},
		HitsAddend:  1,
	}
}

// driven is a Result with the first error seen.
type driven struct {
	Result
	firstErr error
}

// drive runs s.workers callers over conns for s.duration, each sending
// its next call when the last is answered.
func drive(conns []*grpc.ClientConn, s settings, c cell) driven {
	type tally struct {
		ok, over, errs int64
		lat            []time.Duration
		firstErr       error
	}
	tallies := make([]tally, s.workers)
	start := time.Now()
	end := start.Add(s.duration)
	var wg sync.WaitGroup
	for w := range s.workers {
		wg.Go(func() {
			client := rlspb.NewRateLimitServiceClient(conns[w%len(conns)])
			rng := rand.New(rand.NewPCG(uint64(c.repeat), uint64(w)))
			hot := request("route", "/api")
			tl := &tallies[w]
			for time.Now().Before(end) {
				req := hot
				if c.workload == workloadTail {
					req = request("user", strconv.Itoa(rng.IntN(s.users)))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				d := time.Since(t0)
				cancel()
				switch {
				case err != nil:
					tl.errs++
					if tl.firstErr == nil {
						tl.firstErr = err
					}
					continue
				case resp.GetOverallCode() == rlspb.RateLimitResponse_OK:
					tl.ok++
				case resp.GetOverallCode() == rlspb.RateLimitResponse_OVER_LIMIT:
					tl.over++
				default:
					tl.errs++
					if tl.firstErr == nil {
						tl.firstErr = fmt.Errorf("code %v", resp.GetOverallCode())
					}
					continue
				}
				tl.lat = append(tl.lat, d)
			}
		})
	}
	wg.Wait()
	r := driven{Result: Result{
		Service: c.service, Workload: c.workload, RTT: c.rtt, Repeat: c.repeat,
		Elapsed: time.Since(start),
	}}
	for _, tl := range tallies {
		r.OK += tl.ok
		r.OverLimit += tl.over
		r.Errors += tl.errs
		r.Latencies = append(r.Latencies, tl.lat...)
		if r.firstErr == nil {
			r.firstErr = tl.firstErr
		}
	}
	slices.Sort(r.Latencies)
	if c.workload == workloadHot {
		r.Bound = hotLimit + hotLimit*r.Elapsed.Seconds()
	}
	return r
}

// startProxy starts the latency proxy in a process of its own (this test
// binary, see runProxy) in front of the Redis at target, and returns its
// address. In the load's process the proxy's goroutines would wait behind
// the callers for the Go scheduler; in its own they are scheduled by the
// kernel, as a network is.
func startProxy(t *testing.T, target string, rtt time.Duration) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envProxy+"="+target, envProxyRTT+"="+rtt.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr logbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the proxy stops at the end of its stdin
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "addr ")
	if err != nil || !ok {
		t.Fatalf("latency proxy: %q %v\n%s", line, err, &stderr)
	}
	return addr
}

// runProxy is the latency proxy's process: a redistest.Proxy in front of
// target adding rtt, half each way. It writes "addr ADDR" on stdout, and
// stops at the end of its stdin.
func runProxy(target, rtt string) error {
	d, err := time.ParseDuration(rtt)
	if err != nil {
		return fmt.Errorf("bench: proxy: %w", err)
	}
	p, err := redistest.StartProxy(target)
	if err != nil {
		return err
	}
	p.SetLatency(d/2, d-d/2)
	fmt.Printf("addr %s\n", p.Addr())
	io.Copy(io.Discard, os.Stdin)
	return p.Close()
}

// pingTime returns the median of 21 PINGs to addr.
func pingTime(t *testing.T, addr string) time.Duration {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: redistest.LoopbackDialer(5 * time.Second)})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var ds []time.Duration
	for range 21 {
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// TestEnvSwitch: unset and off are false, on is true, anything else is
// an error that names the variable and both words.
func TestEnvSwitch(t *testing.T) {
	const name = "HYBRID_RLS_BENCH_TEST_SWITCH"
	t.Setenv(name, "") // restored after the test, whatever it was
	for _, tt := range []struct {
		value     string
		set, want bool
		err       bool
	}{
		{"", false, false, false},
		{"shared", true, false, false},
		{"split", true, true, false},
		{"1", true, false, true},
	} {
		if tt.set {
			t.Setenv(name, tt.value)
		} else {
			os.Unsetenv(name)
		}
		got, err := envSwitch(name, "shared", "split")
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("%s=%q: envSwitch() = %v, %v; want %v, error %v", name, tt.value, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), name) {
			t.Errorf("envSwitch()'s error %q does not name %s", err, name)
		}
	}
}
