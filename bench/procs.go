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
)

// A fleet of separate processes. RunProcs starts its own executable again,
// once per process, with ShardEnv set; the program's main (or a test's
// TestMain) hands such a process to ServeShard before doing anything else.
// The parent and a shard speak in lines:
//
//	parent → shard, on its stdin:  the job as JSON; "start <unix ns>";
//	                               "down <ns>" and "up <ns>" (an outage,
//	                               since the start); "close" (a long tail:
//	                               the parent has read Redis's figures,
//	                               the limiters may close); EOF: stop early
//	shard → parent, on its stdout: "ready"; "progress <JSON>" once a second;
//	                               "done" when its workers are; "result <JSON>"
//
// Everything else a shard prints goes to stderr, which is the parent's.

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
// SyncInterval, LocalCapacity, MaxKeys, ColdWait, Instances, RefillPace
// and Breaker.CallTimeout; the other fields take their defaults. progress, if
// not nil, is called about once a second with the fleet's progress.
func RunProcs(ctx context.Context, t *Target, sc Scenario, mode string, procs int, progress func(Progress)) (Report, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if procs < 1 || procs > sc.Instances {
		return Report{}, fmt.Errorf("%w: %d processes for %d instances", ErrScenario, procs, sc.Instances)
	}
	if err := prepare(ctx, t, sc, mode); err != nil {
		return Report{}, err
	}
	exe, err := os.Executable()
	if err != nil {
		return Report{}, fmt.Errorf("bench: %w", err)
	}
	r := newRunRange(t, sc, mode, t.prefix(mode), 0, 0)
	r.redisEmpty(ctx)

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
		if sc.Passes > 0 {
			t.cleanTail(context.WithoutCancel(ctx), r.prefix)
		}
	}()
	for i := range procs {
		lo, hi := i*sc.Instances/procs, (i+1)*sc.Instances/procs
		job := shardJob{Kind: t.kind, Addrs: t.addrs, Via: t.via, Scenario: toShard(sc), Mode: mode, Prefix: r.prefix, Lo: lo, Hi: hi}
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

	r.redisBefore(ctx)
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
				p.Mode, p.Duration, p.Asks = mode, sc.Duration, sc.asks()
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
	if sc.Passes > 0 {
		r.redisLast(context.WithoutCancel(ctx))
		for _, s := range shards {
			s.tell("close")
		}
	}

	var (
		total    tally
		timeline []Sample
		elapsed  time.Duration
		closeErr []string
		cmds     int64         // until the limiters had closed
		cpu      time.Duration // the shards' CPU time; 0 if one did not tell
		cpuOK    = true
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
		cmds += res.Commands
		cpu += res.CPU
		cpuOK = cpuOK && res.CPU > 0
		timeline = mergeTimelines(timeline, res.Timeline)
		elapsed = max(elapsed, res.Elapsed)
		if res.CloseError != "" {
			closeErr = append(closeErr, fmt.Sprintf("shard %d: %s", i, res.CloseError))
		}
	}
	rep := r.build(total, t1.Sub(t0), elapsed, timeline)
	r.longTail(&rep, total)
	// Every shard has ended, its limiters closed, as in Run.
	r.tailCommands(&rep, cmds)
	if cpuOK {
		tailCPU(&rep, cpu)
	}
	r.tailRedis(context.WithoutCancel(ctx), &rep)
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
