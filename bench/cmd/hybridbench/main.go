// Command hybridbench simulates a fleet of instances sharing a rate limit,
// runs each limiting mode through the same load one after another, and
// prints what each admitted against the ideal B + R*T, its decision latency
// and its Redis load. See bench/README.md.
//
//	go run ./bench/cmd/hybridbench                        # embedded miniredis
//	go run ./bench/cmd/hybridbench -spawn-redis           # a redis-server it starts and stops
//	go run ./bench/cmd/hybridbench -redis 127.0.0.1:6379  # a running Redis (loopback only)
//	go run ./bench/cmd/hybridbench -spawn-cluster         # a 3-master Redis Cluster it starts and stops
//
// With no Redis flag it needs nothing but Go: it starts an embedded
// miniredis. The default run (8 instances, one hot key, R=1000/s B=1000,
// 4x demand: 4000 requests/s) takes about len(modes) times -duration, plus
// up to 3 s per hybrid mode for the instances to count each other (about
// 23 s with -duration 5s). What to expect on miniredis: lease, optimistic
// and local keep up with the load whatever it is (they send a few commands
// a second per instance: about 0.05 and 0.02 commands per decision here).
// exact makes one script call per decision, and miniredis runs scripts far
// more slowly than redis-server: at the default 4000 requests/s it still
// keeps up on a 2-core machine, at a median latency of about 1.5 ms
// (against about 0.25 ms on redis-server), but it tops out near 7000 calls
// a second, so at a higher -demand or -rate exact answers fewer decisions
// per second than offered (dec/s below the offered rate in the heading,
// most requests late) and, with more -workers, its calls time out into the
// fallback. Accuracy figures stay meaningful as long as the achieved rate
// exceeds the limit. miniredis slowed down by a large load also makes the
// hybrid Limiter's settlement rounds time out (the "redis err" column); see
// the note on them in bench/README.md. Use -spawn-redis or -redis for
// figures to compare exact and redis_rate with.
//
// Local admits what it is asked, up to the instances times the ideal: at
// the default 4x demand each instance is asked half its own limit, so it
// admits every request (3.3 times the ideal in 5 s); with -demand 16 each
// is asked twice its limit and the fleet admits 8 times the ideal.
//
// A progress line on stderr is rewritten once a second (-q turns it off);
// the table goes to stdout, -json FILE writes every report as JSON, and
// -plot FILE draws the admitted rate over time per mode as an SVG chart.
//
// -latency D (e.g. 1ms) adds D to every round trip between the fleet and
// Redis, half each way: the fleet's clients dial a TCP proxy, run in a
// process of its own, in front of each Redis node (every node of a
// cluster, its MOVED and ASK redirections mapped to the proxies). The
// bench's own reads of Redis go direct. The heading gives PING's round trip
// through the proxy and direct.
//
// -outage DUR@AT (e.g. 2s@5s) takes the Redis away during each mode's run,
// at AT after the first arrival, for DUR, and brings it back empty: the
// spawned redis-server is killed and started again on the same port, the
// embedded miniredis closed, restarted and flushed. A Redis given with
// -redis or -cluster is refused. The table then gains columns for the
// decisions issued while Redis was down, and the time the hybrid instances
// took to leave their fallback; the plot shades the outage.
//
// -closed replaces the open-loop arrivals with a closed loop: every worker
// asks again as soon as it is answered, and the run measures the most
// decisions per second each mode can make (-demand is ignored).
//
// -procs N runs the instances in N separate processes of this command,
// coordinated through Redis alone, as a fleet of services is; this process
// owns the Redis, measures the window and adds up what the others counted.
//
// -passes N makes the run a long tail, as of per-user limits: a closed loop
// in which every one of the -keys keys is asked exactly N times, spread
// over the fleet, and that ends when the last ask is answered (-duration
// then only bounds it, 10m unless given). On a single real Redis it also
// reads what each mode cost the server (INFO commandstats, memory and cpu,
// DBSIZE) and prints a table of its own, with each mode's decisions per
// second and Redis time per decision as ratios to redis_rate's:
//
//	go run ./bench/cmd/hybridbench -spawn-redis -q -passes 3 -keys 50000 -instances 4 -workers 8 \
//		-rate 0.1667 -burst 20 -modes lease,optimistic,exact,redis_rate,redis_rate_ap
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/bench"
	"github.com/hybridlimit/hybrid/internal/plural"
)

func main() {
	if bench.IsShard() { // started by -procs: run some of the instances
		os.Exit(bench.ServeShard())
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hybridbench:", err)
		os.Exit(1)
	}
}

func run() error {
	var err error
	var (
		sc      bench.Scenario
		modes   = flag.String("modes", "", "comma-separated modes: lease, optimistic, exact, local, redis_rate, redis_rate_ap (default lease,optimistic,exact,local, and redis_rate on a real Redis)")
		addr    = flag.String("redis", "", "use the Redis at this loopback `address`")
		cluster = flag.String("cluster", "", "use the Redis Cluster with these comma-separated loopback `addresses`")
		spawn   = flag.Bool("spawn-redis", false, "start a redis-server from PATH on a free loopback port, and stop it at the end")
		spawnC  = flag.Bool("spawn-cluster", false, "start a 3-master Redis Cluster (redis-server and redis-cli from PATH) on free loopback ports, and stop it at the end")
		jsonOut = flag.String("json", "", "write the reports as JSON to `file`")
		plotOut = flag.String("plot", "", "draw the admitted rate over time per mode as an SVG `file`")
		sweep   = flag.Bool("sweep", false, "run lease and optimistic over every -sweep-sync and -sweep-lc setting and print accuracy against Redis load")
		sSync   = flag.String("sweep-sync", "50ms,100ms,200ms", "SyncInterval `values` for -sweep")
		sLC     = flag.String("sweep-lc", "256,4096,65536", "LocalCapacity `values` for -sweep, in tokens")
		quiet   = flag.Bool("q", false, "no progress line")
		outage  = flag.String("outage", "", "take the Redis away during each mode's run, `DUR@AT`: at AT after the first arrival, for DUR (e.g. 2s@5s), and bring it back empty; embedded miniredis or -spawn-redis only")
		latency = flag.Duration("latency", 0, "round trip to add between the fleet and Redis, half each way, through a TCP proxy in a process of its own in front of every Redis node (0: none, direct)")
	)
	flag.IntVar(&sc.Instances, "instances", 8, "instances in the fleet, each with its own Redis client and limiter")
	procs := flag.Int("procs", 0, "run the instances in this many separate processes (0: all in this one), coordinated through Redis only")
	flag.DurationVar(&sc.Duration, "duration", 10*time.Second, "how long requests arrive, per mode")
	flag.IntVar(&sc.Keys, "keys", 1, "keys asked for")
	flag.StringVar(&sc.Dist, "dist", bench.Uniform, "key distribution: uniform or zipf")
	flag.Float64Var(&sc.ZipfS, "zipf", 1.1, "Zipf exponent s > 1, with -dist zipf")
	flag.Float64Var(&sc.Demand, "demand", 4, "load as a multiple of the sum of the keys' limits")
	flag.BoolVar(&sc.Closed, "closed", false, "closed loop: each worker asks again as soon as answered (the fleet's most decisions per second); -demand is ignored")
	flag.IntVar(&sc.Passes, "passes", 0, "a long tail: ask every key exactly this many times over the run, in a closed loop, and end when done (-duration is then a bound, 10m unless given); 0: off")
	flag.IntVar(&sc.Spread, "spread", 0, "with -passes: how many instances ask each key in each pass, at about the same time (a user's requests spread over several instances within a round); 0 or 1: one")
	flag.Float64Var(&sc.Rate, "rate", 1000, "each key's limit, tokens per second")
	flag.Int64Var(&sc.Burst, "burst", 1000, "each key's burst, tokens")
	flag.Int64Var(&sc.Cost, "cost", 1, "tokens per request")
	flag.IntVar(&sc.Workers, "workers", 4, "goroutines issuing each instance's requests")
	flag.Uint64Var(&sc.Seed, "seed", 1, "seed of the arrival times and keys")
	flag.DurationVar(&sc.Config.SyncInterval, "sync-interval", 0, "hybrid Config.SyncInterval (0: the default, 100ms)")
	flag.Int64Var(&sc.Config.LocalCapacity, "local-capacity", 0, "hybrid Config.LocalCapacity in tokens (0: the default, 4096)")
	flag.DurationVar(&sc.Config.ColdWait, "cold-wait", 0, "hybrid Config.ColdWait (0: the default, the breaker's call timeout)")
	flag.DurationVar(&sc.Config.RefillPace, "refill-pace", 0, "hybrid Config.RefillPace (0: the default, 1ms)")
	flag.BoolVar(&sc.Warm, "warm", false, "call each hybrid Limiter's Warm before the run (script loaded, connection open)")
	flag.DurationVar(&sc.Config.Breaker.CallTimeout, "call-timeout", 0, "hybrid Config.Breaker.CallTimeout, the least deadline of a call to Redis (0: the default, 50ms)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: hybridbench [flags]\n\nSimulates a fleet sharing a rate limit and compares the limiting modes.\n\n")
		flag.PrintDefaults()
	}
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to `file` (go tool pprof reads it)")
	traceFile := flag.String("trace", "", "write an execution trace of the whole run to `file` (go tool trace reads it)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	stopProfile, err := record(*cpuProfile, pprof.StartCPUProfile, pprof.StopCPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	stopTrace, err := record(*traceFile, trace.Start, trace.Stop)
	if err != nil {
		return err
	}
	defer stopTrace()
	if sc.Passes > 0 {
		if *outage != "" {
			return errors.New("-outage and -passes exclude each other")
		}
		given := false
		flag.Visit(func(f *flag.Flag) { given = given || f.Name == "duration" })
		if !given {
			sc.Duration = 0 // the long tail's bound, 10m
		}
	}
	if sc.Outage, err = bench.ParseOutage(*outage); err != nil {
		return fmt.Errorf("-outage: %w", err)
	}
	if sc.Outage.For > 0 && (*addr != "" || *cluster != "" || *spawnC) {
		return errors.New("-outage needs a Redis this command owns, to kill and restart: the embedded miniredis or -spawn-redis, not -redis or -cluster")
	}
	if sc.Outage.For > 0 && sc.Outage.At+sc.Outage.For > sc.Duration {
		return fmt.Errorf("-outage %s ends after -duration %v", *outage, sc.Duration)
	}
	if sc.Outage.For > 0 {
		// Every client would log each refused dial while Redis is down.
		redis.SetLogger(quietLogger{})
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if *latency < 0 {
		return fmt.Errorf("-latency %v is negative", *latency)
	}
	target, err := openTarget(*addr, *cluster, *spawn, *spawnC)
	if err != nil {
		return err
	}
	defer target.Close()
	if err := target.AddLatency(ctx, *latency); err != nil {
		return fmt.Errorf("-latency: %w", err)
	}

	list := bench.Modes(target)
	if *modes != "" {
		list = nil
		for _, m := range strings.Split(*modes, ",") {
			if m = strings.TrimSpace(m); m != "" {
				list = append(list, m)
			}
		}
	}

	for _, m := range list {
		switch m {
		case bench.Lease, bench.Optimistic, bench.Exact, bench.Local:
		case bench.RedisRate, bench.RedisRateAP:
			if !target.Real() {
				return fmt.Errorf("%s needs a real Redis: -redis, -cluster or -spawn-redis", m)
			}
		default:
			return fmt.Errorf("unknown mode %q", m)
		}
	}

	where := ""
	if *procs > 0 {
		where = fmt.Sprintf(", in %d processes", *procs)
	}
	fmt.Printf("%s%s\non %s\n\n", sc, where, target)
	if *sweep {
		return runSweep(ctx, target, sc, list, *sSync, *sLC, *quiet)
	}
	var reports []bench.Report
	for _, mode := range list {
		var progress func(bench.Progress)
		if !*quiet {
			progress = printProgress
		}
		var rep bench.Report
		if *procs > 0 {
			rep, err = bench.RunProcs(ctx, target, sc, mode, *procs, progress)
		} else {
			rep, err = bench.Run(ctx, target, sc, mode, progress)
		}
		if !*quiet {
			fmt.Fprintf(os.Stderr, "\r%-80s\r", "")
		}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				break
			}
			return fmt.Errorf("%s: %w", mode, err)
		}
		if rep.CloseError != "" {
			fmt.Fprintf(os.Stderr, "hybridbench: %s: closing: %s\n", mode, rep.CloseError)
		}
		reports = append(reports, rep)
	}
	switch {
	case len(reports) == 0:
	case sc.Passes > 0:
		bench.Compare(reports, bench.RedisRate)
		if err := bench.WriteLongTail(os.Stdout, reports); err != nil {
			return err
		}
	default:
		if err := bench.WriteTable(os.Stdout, reports); err != nil {
			return err
		}
	}
	if err := bench.WriteHealth(os.Stdout, reports); err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(reports, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *plotOut != "" && len(reports) > 0 {
		var buf bytes.Buffer
		if err := bench.Chart(sc, reports).WriteSVG(&buf); err != nil {
			return err
		}
		if err := os.WriteFile(*plotOut, buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	return target.Close()
}

// openTarget returns the Redis the flags name, an embedded miniredis if
// none.
func openTarget(addr, cluster string, spawn, spawnCluster bool) (*bench.Target, error) {
	n := 0
	for _, set := range []bool{addr != "", cluster != "", spawn, spawnCluster} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, errors.New("-redis, -cluster, -spawn-redis and -spawn-cluster exclude each other")
	case spawnCluster:
		return bench.SpawnCluster()
	case addr != "":
		return bench.Dial(addr)
	case cluster != "":
		var addrs []string
		for _, a := range strings.Split(cluster, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		return bench.DialCluster(addrs)
	case spawn:
		return bench.SpawnRedis()
	}
	return bench.Miniredis()
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// printProgress rewrites the progress line on stderr.
func printProgress(p bench.Progress) {
	line := fmt.Sprintf("%-10s %4.0fs/%.0fs  %8.0f decisions/s  %d decisions, %d admitted",
		p.Mode, p.Elapsed.Seconds(), p.Duration.Seconds(), p.Rate, p.Decisions, p.Admitted)
	if p.Asks > 0 {
		line = fmt.Sprintf("%-13s %4.0fs  %8.0f decisions/s  %d of %d asks, %d admitted",
			p.Mode, p.Elapsed.Seconds(), p.Rate, p.Decisions, p.Asks, p.Admitted)
	}
	if p.Errors > 0 {
		line += ", " + plural.Count(p.Errors, "error")
	}
	fmt.Fprintf(os.Stderr, "\r%-80s", line)
}

// runSweep runs lease and optimistic (those of modes) over every pair of
// SyncInterval and LocalCapacity values and prints the sweep table.
func runSweep(ctx context.Context, target *bench.Target, sc bench.Scenario, modes []string, syncs, lcs string, quiet bool) error {
	var intervals []time.Duration
	for _, f := range strings.Split(syncs, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return fmt.Errorf("-sweep-sync %q: not a positive duration", f)
		}
		intervals = append(intervals, d)
	}
	var caps []int64
	for _, f := range strings.Split(lcs, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("-sweep-lc %q: not a positive number of tokens", f)
		}
		caps = append(caps, n)
	}
	var reports []bench.Report
	for _, mode := range modes {
		if mode != bench.Lease && mode != bench.Optimistic {
			continue
		}
		for _, d := range intervals {
			for _, lc := range caps {
				run := sc
				run.Config.SyncInterval, run.Config.LocalCapacity = d, lc
				var progress func(bench.Progress)
				if !quiet {
					progress = printProgress
				}
				rep, err := bench.Run(ctx, target, run, mode, progress)
				if !quiet {
					fmt.Fprintf(os.Stderr, "\r%-80s\r", "")
				}
				if err != nil {
					return fmt.Errorf("%s sync %v lc %d: %w", mode, d, lc, err)
				}
				reports = append(reports, rep)
			}
		}
	}
	if len(reports) == 0 {
		return errors.New("-sweep runs lease and optimistic: -modes names neither")
	}
	if err := bench.WriteSweep(os.Stdout, reports); err != nil {
		return err
	}
	return target.Close()
}

// record starts a recording of the run into file with start (a CPU profile
// or an execution trace) and returns what ends it: stop, then the file
// closed. No file: nothing is recorded, and the end does nothing.
func record(file string, start func(io.Writer) error, stop func()) (end func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		stop()
		f.Close()
	}, nil
}
