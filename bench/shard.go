package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// The shard's side of RunProcs: a process that runs some of the fleet's
// instances (see procs.go for the protocol).

// ShardEnv is the environment variable that makes a process a helper of
// this package: a shard of RunProcs, or the proxy of a Target with latency
// (Target.AddLatency). IsShard reports it, ServeShard serves it.
const ShardEnv = "HYBRIDBENCH_SHARD"

// shardJob is what a shard runs: instances [Lo, Hi) of the fleet.
type shardJob struct {
	Kind     targetKind        `json:"kind"`
	Addrs    []string          `json:"addrs"`
	Via      map[string]string `json:"via,omitempty"` // Target.via: the proxies the clients dial
	Scenario shardScenario     `json:"scenario"`
	Mode     string            `json:"mode"`
	Prefix   string            `json:"prefix"`
	Lo       int               `json:"lo"`
	Hi       int               `json:"hi"`
}

// shardScenario is a Scenario as a shard receives it: the fields of
// Scenario.Config that RunProcs passes on, the others being defaults.
type shardScenario struct {
	Instances     int           `json:"instances"`
	Duration      time.Duration `json:"duration"`
	Keys          int           `json:"keys"`
	Dist          string        `json:"dist"`
	ZipfS         float64       `json:"zipf_s"`
	Demand        float64       `json:"demand"`
	Rate          float64       `json:"rate"`
	Burst         int64         `json:"burst"`
	Cost          int64         `json:"cost"`
	Workers       int           `json:"workers"`
	Seed          uint64        `json:"seed"`
	Closed        bool          `json:"closed"`
	Passes        int           `json:"passes"`
	Spread        int           `json:"spread,omitempty"`
	Warm          bool          `json:"warm,omitempty"`
	OutageAt      time.Duration `json:"outage_at"`
	OutageFor     time.Duration `json:"outage_for"`
	SyncInterval  time.Duration `json:"sync_interval"`
	LocalCapacity int64         `json:"local_capacity"`
	MaxKeys       int           `json:"max_keys"`
	ColdWait      time.Duration `json:"cold_wait"`
	RefillPace    time.Duration `json:"refill_pace,omitempty"`
	Fleet         int           `json:"fleet"`
	CallTimeout   time.Duration `json:"call_timeout"`
}

func toShard(sc Scenario) shardScenario {
	return shardScenario{
		Instances: sc.Instances, Duration: sc.Duration, Keys: sc.Keys, Dist: sc.Dist, ZipfS: sc.ZipfS,
		Demand: sc.Demand, Rate: sc.Rate, Burst: sc.Burst, Cost: sc.Cost, Workers: sc.Workers,
		Seed: sc.Seed, Closed: sc.Closed, Passes: sc.Passes, Spread: sc.Spread, Warm: sc.Warm, OutageAt: sc.Outage.At, OutageFor: sc.Outage.For,
		SyncInterval: sc.Config.SyncInterval, LocalCapacity: sc.Config.LocalCapacity,
		MaxKeys: sc.Config.MaxKeys, ColdWait: sc.Config.ColdWait, Fleet: sc.Config.Instances,
		RefillPace: sc.Config.RefillPace, CallTimeout: sc.Config.Breaker.CallTimeout,
	}
}

func (s shardScenario) scenario() Scenario {
	sc := Scenario{
		Instances: s.Instances, Duration: s.Duration, Keys: s.Keys, Dist: s.Dist, ZipfS: s.ZipfS,
		Demand: s.Demand, Rate: s.Rate, Burst: s.Burst, Cost: s.Cost, Workers: s.Workers,
		Seed: s.Seed, Closed: s.Closed, Passes: s.Passes, Spread: s.Spread, Warm: s.Warm, Outage: Outage{At: s.OutageAt, For: s.OutageFor},
	}
	sc.Config = hybrid.Config{
		SyncInterval: s.SyncInterval, LocalCapacity: s.LocalCapacity, MaxKeys: s.MaxKeys,
		ColdWait: s.ColdWait, Instances: s.Fleet, RefillPace: s.RefillPace,
	}
	sc.Config.Breaker.CallTimeout = s.CallTimeout
	return sc
}

// shardResult is what a shard sends back at the end.
type shardResult struct {
	Tally      tally         `json:"tally"`
	Timeline   []Sample      `json:"timeline"`
	Elapsed    time.Duration `json:"elapsed"`
	CloseError string        `json:"close_error,omitempty"`
	// Commands counts the commands sent from the start until the limiters
	// had closed.
	Commands int64 `json:"commands"`
	// CPU is the CPU time the shard used over the same span, in a long
	// tail; 0 if not measured.
	CPU time.Duration `json:"cpu,omitempty"`
}

// IsShard reports whether this process was started by this package as a
// helper: a shard of a RunProcs fleet, or a Target's proxy.
func IsShard() bool { return os.Getenv(ShardEnv) != "" }

// ServeShard runs this process as the helper it was started as (a shard of
// a RunProcs fleet, or a Target's proxy), on the job read from stdin, and
// returns the exit code. Call it first thing in main when IsShard is true.
func ServeShard() int {
	if os.Getenv(ShardEnv) == shardProxy {
		if err := serveProxy(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench proxy:", err)
			return 1
		}
		return 0
	}
	redis.SetLogger(quietLogger{}) // refused dials during an outage
	if err := serveShard(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench shard:", err)
		return 1
	}
	return 0
}

// quietLogger drops go-redis's own log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func serveShard(in io.Reader, out io.Writer) error {
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 64<<10), 16<<20)
	if !lines.Scan() {
		return fmt.Errorf("no job: %v", lines.Err())
	}
	var job shardJob
	if err := json.Unmarshal(lines.Bytes(), &job); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	sc, err := job.Scenario.scenario().withDefaults()
	if err != nil {
		return err
	}
	t, err := open(&Target{kind: job.Kind, addrs: job.Addrs, via: job.Via})
	if err != nil {
		return err
	}
	defer t.Close()

	var mu sync.Mutex // serializes the lines written to out
	send := func(kind string, v any) error {
		line := kind
		if v != nil {
			b, err := json.Marshal(v)
			if err != nil {
				return err
			}
			line += " " + string(b)
		}
		mu.Lock()
		defer mu.Unlock()
		_, err := io.WriteString(out, line+"\n")
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := newRunRange(t, sc, job.Mode, job.Prefix, job.Lo, job.Hi)
	defer r.close()
	if err := r.start(ctx); err != nil {
		return err
	}
	if err := send("ready", nil); err != nil {
		return err
	}
	if !lines.Scan() {
		return fmt.Errorf("no start: %v", lines.Err())
	}
	ns, ok := strings.CutPrefix(lines.Text(), "start ")
	if !ok {
		return fmt.Errorf("want a start line, got %q", lines.Text())
	}
	at, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	start := time.Unix(0, at)
	// The rest of stdin: the outage's moments or "close", then EOF.
	closing := make(chan struct{})
	closeOnce := sync.OnceFunc(func() { close(closing) })
	go func() {
		for lines.Scan() {
			kind, v, _ := strings.Cut(lines.Text(), " ")
			if kind == "close" {
				closeOnce()
				continue
			}
			d, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch kind {
			case "down":
				r.downAt.Store(d)
			case "up":
				r.backAt.Store(d)
			}
		}
		cancel() // the parent is gone or stopping us
	}()

	heapBefore := heapAlloc()
	sentBefore := r.sent()
	cmdsBefore := r.commands()
	if wait := time.Until(start); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.cpuStart()
	timeline, elapsed := r.drive(ctx, start, func(p Progress) { send("progress", p) })
	if err := send("done", nil); err != nil {
		return err
	}
	if sc.Passes > 0 {
		// The parent reads Redis's figures before the limiters close.
		select {
		case <-closing:
		case <-ctx.Done():
		}
	}
	res := shardResult{Tally: r.tally(heapBefore, cmdsBefore, sentBefore), Timeline: timeline, Elapsed: elapsed}
	if errs := r.close(); len(errs) > 0 {
		res.CloseError = errors.Join(errs...).Error()
	}
	res.Commands = r.commands() - cmdsBefore
	res.CPU = r.cpuSince()
	return send("result", res)
}
