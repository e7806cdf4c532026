package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// A fleet of separate processes. RunProcs starts its own executable again,
// once per process, with ShardEnv set; the program's main (or a test's
// TestMain) hands such a process to ServeShard before doing anything else.
// The parent and a shard speak in lines:
//
//	parent → shard, on its stdin:  the job as JSON; "start <unix ns>";
//	                               "down <ns>" and "up <ns>" (an outage,
//	                               since the start); EOF: stop early
//	shard → parent, on its stdout: "ready"; "progress <JSON>" once a second;
//	                               "done" when its workers are; "result <JSON>"
//
// Everything else a shard prints goes to stderr, which is the parent's.

// ShardEnv is the environment variable that makes a process a shard of
// RunProcs: IsShard reports it, ServeShard serves it.
const ShardEnv = "HYBRIDBENCH_SHARD"

// readyWait bounds the wait for the shards to start, connect and count
// each other.
const readyWait = 30 * time.Second

// startLead is how far ahead of now the shards are told to start, so that
// every one has read the start line by then.
const startLead = 200 * time.Millisecond

// t0Lead is how long before the start the parent reads the Redis clock:
// more than a round trip on loopback, so that T begins before the first
// arrival.
const t0Lead = 5 * time.Millisecond

// shardJob is what a shard runs: instances [Lo, Hi) of the fleet.
type shardJob struct {
	Kind     targetKind    `json:"kind"`
	Addrs    []string      `json:"addrs"`
	Scenario shardScenario `json:"scenario"`
	Mode     string        `json:"mode"`
	Prefix   string        `json:"prefix"`
	Lo       int           `json:"lo"`
	Hi       int           `json:"hi"`
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
	OutageAt      time.Duration `json:"outage_at"`
	OutageFor     time.Duration `json:"outage_for"`
	SyncInterval  time.Duration `json:"sync_interval"`
	LocalCapacity int64         `json:"local_capacity"`
	MaxKeys       int           `json:"max_keys"`
	ColdWait      time.Duration `json:"cold_wait"`
	Fleet         int           `json:"fleet"`
	CallTimeout   time.Duration `json:"call_timeout"`
}

func toShard(sc Scenario) shardScenario {
	return shardScenario{
		Instances: sc.Instances, Duration: sc.Duration, Keys: sc.Keys, Dist: sc.Dist, ZipfS: sc.ZipfS,
		Demand: sc.Demand, Rate: sc.Rate, Burst: sc.Burst, Cost: sc.Cost, Workers: sc.Workers,
		Seed: sc.Seed, Closed: sc.Closed, OutageAt: sc.Outage.At, OutageFor: sc.Outage.For,
		SyncInterval: sc.Config.SyncInterval, LocalCapacity: sc.Config.LocalCapacity,
		MaxKeys: sc.Config.MaxKeys, ColdWait: sc.Config.ColdWait, Fleet: sc.Config.Instances,
		CallTimeout: sc.Config.Breaker.CallTimeout,
	}
}

func (s shardScenario) scenario() Scenario {
	sc := Scenario{
		Instances: s.Instances, Duration: s.Duration, Keys: s.Keys, Dist: s.Dist, ZipfS: s.ZipfS,
		Demand: s.Demand, Rate: s.Rate, Burst: s.Burst, Cost: s.Cost, Workers: s.Workers,
		Seed: s.Seed, Closed: s.Closed, Outage: Outage{At: s.OutageAt, For: s.OutageFor},
	}
	sc.Config = hybrid.Config{
		SyncInterval: s.SyncInterval, LocalCapacity: s.LocalCapacity, MaxKeys: s.MaxKeys,
		ColdWait: s.ColdWait, Instances: s.Fleet,
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
}

// IsShard reports whether this process was started by RunProcs as a shard
// of a fleet.
func IsShard() bool { return os.Getenv(ShardEnv) != "" }

// ServeShard runs this process as a shard of a RunProcs fleet, on the job
// read from stdin, and returns the exit code. Call it first thing in main
// when IsShard is true.
func ServeShard() int {
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
	t, err := open(&Target{kind: job.Kind, addrs: job.Addrs})
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
	// The rest of stdin: the outage's moments, then EOF.
	go func() {
		for lines.Scan() {
			kind, v, _ := strings.Cut(lines.Text(), " ")
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
	cmdsBefore := r.commands()
	if wait := time.Until(start); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	timeline, elapsed := r.drive(ctx, start, func(p Progress) { send("progress", p) })
	if err := send("done", nil); err != nil {
		return err
	}
	res := shardResult{Tally: r.tally(heapBefore, cmdsBefore), Timeline: timeline, Elapsed: elapsed}
	if errs := r.close(); len(errs) > 0 {
		res.CloseError = errors.Join(errs...).Error()
	}
	return send("result", res)
}

// shard is the parent's handle on one shard process.
type shard struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex // serializes the lines written to stdin

	ready  chan struct{} // closed on "ready"
	done   chan struct{} // closed on "done"
	exited chan struct{} // closed when the process has ended; res is set by then
	res    *shardResult  // the result, if one came

	last struct {
		sync.Mutex
		p Progress
	}
}

func (s *shard) tell(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	io.WriteString(s.stdin, line+"\n")
}

// read reads the shard's lines until its stdout closes.
func (s *shard) read(out io.Reader) {
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 64<<10), 256<<20)
	readyOnce, doneOnce := sync.OnceFunc(func() { close(s.ready) }), sync.OnceFunc(func() { close(s.done) })
	for lines.Scan() {
		kind, v, _ := strings.Cut(lines.Text(), " ")
		switch kind {
		case "ready":
			readyOnce()
		case "progress":
			var p Progress
			if json.Unmarshal([]byte(v), &p) == nil {
				s.last.Lock()
				s.last.p = p
				s.last.Unlock()
			}
		case "done":
			doneOnce()
		case "result":
			var res shardResult
			if err := json.Unmarshal([]byte(v), &res); err == nil {
				s.res = &res
			}
		}
	}
}

// RunProcs is Run with the fleet's instances split over procs separate
// processes of this executable (which must call ServeShard when IsShard),
// coordinated through t's Redis only, as a fleet of services is. The parent
// owns t: it measures the window on the Redis clock, takes Redis down for an
// Outage and tells the shards when. Of sc.Config, the shards get
// SyncInterval, LocalCapacity, MaxKeys, ColdWait, Instances and
// Breaker.CallTimeout; the other fields take their defaults. progress, if
// not nil, is called about once a second with the fleet's progress.
func RunProcs(ctx context.Context, t *Target, sc Scenario, mode string, procs int, progress func(Progress)) (Report, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if procs < 1 || procs > sc.Instances {
		return Report{}, fmt.Errorf("%w: %d processes for %d instances", ErrScenario, procs, sc.Instances)
	}
	switch mode {
	case Lease, Optimistic, Exact, Local:
	case RedisRate:
		if !t.Real() {
			return Report{}, ErrNeedsRedis
		}
	default:
		return Report{}, fmt.Errorf("%w %q", ErrMode, mode)
	}
	if sc.Outage.For > 0 && !t.Owned() {
		return Report{}, fmt.Errorf("%w: %s", ErrNotOwned, t)
	}
	exe, err := os.Executable()
	if err != nil {
		return Report{}, fmt.Errorf("bench: %w", err)
	}
	r := newRunRange(t, sc, mode, t.prefix(mode), 0, 0)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		shards []*shard
		wg     sync.WaitGroup
	)
	defer func() {
		for _, s := range shards {
			s.stdin.Close() // a shard still running stops
		}
		wg.Wait()
	}()
	for i := range procs {
		lo, hi := i*sc.Instances/procs, (i+1)*sc.Instances/procs
		job := shardJob{Kind: t.kind, Addrs: t.addrs, Scenario: toShard(sc), Mode: mode, Prefix: r.prefix, Lo: lo, Hi: hi}
		b, err := json.Marshal(job)
		if err != nil {
			return Report{}, err
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), ShardEnv+"=1")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = sysProcAttr()
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return Report{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return Report{}, err
		}
		if err := cmd.Start(); err != nil {
			return Report{}, fmt.Errorf("bench: start shard %d: %w", i, err)
		}
		s := &shard{cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan struct{}), exited: make(chan struct{})}
		shards = append(shards, s)
		wg.Go(func() {
			s.read(stdout)
			cmd.Wait()
			close(s.exited)
		})
		s.tell(string(b))
	}
	wait := func(what string, ch func(*shard) <-chan struct{}, limit time.Duration) error {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		for i, s := range shards {
			select {
			case <-ch(s):
			case <-s.exited:
				select {
				case <-ch(s): // it said so before it ended
					continue
				default:
				}
				return fmt.Errorf("bench: shard %d ended before %s: %v", i, what, s.cmd.ProcessState)
			case <-timer.C:
				return fmt.Errorf("bench: shard %d not %s within %v", i, what, limit)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	if err := wait("ready", func(s *shard) <-chan struct{} { return s.ready }, readyWait); err != nil {
		return Report{}, err
	}

	start := time.Now().Add(startLead)
	for _, s := range shards {
		s.tell("start " + strconv.FormatInt(start.UnixNano(), 10))
	}
	// T starts on the Redis clock just before the first arrival, as in Run.
	select {
	case <-time.After(time.Until(start.Add(-t0Lead))):
	case <-ctx.Done():
		return Report{}, ctx.Err()
	}
	t0, err := t.now(ctx)
	if err != nil {
		return Report{}, err
	}
	var (
		owg    sync.WaitGroup
		outErr error
	)
	if sc.Outage.For > 0 {
		r.onOutage = func(kind string, at int64) {
			for _, s := range shards {
				s.tell(kind + " " + strconv.FormatInt(at, 10))
			}
		}
		owg.Go(func() { outErr = r.outage(ctx, start) })
	}
	pdone := make(chan struct{})
	var pwg sync.WaitGroup
	if progress != nil {
		pwg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-pdone:
					return
				case <-tick.C:
				}
				var p Progress
				for _, s := range shards {
					s.last.Lock()
					q := s.last.p
					s.last.Unlock()
					p.Decisions += q.Decisions
					p.Admitted += q.Admitted
					p.Errors += q.Errors
					p.Rate += q.Rate
					p.Elapsed = max(p.Elapsed, q.Elapsed)
				}
				p.Mode, p.Duration = mode, sc.Duration
				progress(p)
			}
		})
	}
	werr := wait("done", func(s *shard) <-chan struct{} { return s.done }, sc.Duration+startLead+time.Minute)
	close(pdone)
	pwg.Wait()
	owg.Wait()
	if werr != nil {
		return Report{}, errors.Join(werr, outErr)
	}
	t1, terr := t.now(context.WithoutCancel(ctx))

	var (
		total    tally
		timeline []Sample
		elapsed  time.Duration
		closeErr []string
	)
	for i, s := range shards {
		select {
		case <-s.exited:
		case <-time.After(closeTimeout + 5*time.Second):
			return Report{}, fmt.Errorf("bench: shard %d did not end", i)
		}
		res := s.res
		if res == nil {
			return Report{}, fmt.Errorf("bench: shard %d ended without a result: %v", i, s.cmd.ProcessState)
		}
		total.add(&res.Tally)
		timeline = mergeTimelines(timeline, res.Timeline)
		elapsed = max(elapsed, res.Elapsed)
		if res.CloseError != "" {
			closeErr = append(closeErr, fmt.Sprintf("shard %d: %s", i, res.CloseError))
		}
	}
	rep := r.build(total, t1.Sub(t0), elapsed, timeline)
	rep.Procs = procs
	if len(closeErr) > 0 {
		rep.CloseError = strings.Join(closeErr, "; ")
	}
	if err := errors.Join(outErr, terr); err != nil {
		return rep, err
	}
	return rep, ctx.Err()
}

// mergeTimelines adds the samples of b to those of a, second by second.
func mergeTimelines(a, b []Sample) []Sample {
	for i, s := range b {
		if i == len(a) {
			a = append(a, s)
			continue
		}
		a[i].At = max(a[i].At, s.At)
		a[i].Decisions += s.Decisions
		a[i].Admitted += s.Admitted
		a[i].Fallback += s.Fallback
		a[i].Degraded = a[i].Degraded || s.Degraded
	}
	return a
}
