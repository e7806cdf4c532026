package bench

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid/internal/proccpu"
	"github.com/redis/go-redis/v9"
)

// A long tail's steps on the Redis side: empty a spawned server first,
// read its figures around the run (redisstats.go), delete the run's keys
// from a server given by address at the end.

// tailState is what a long tail keeps for its figures: the server's
// readings, and the commands the fleet sent.
type tailState struct {
	empty, reset, last *redisSnapshot   // nil: not (yet) read
	err                error            // reading them failed
	sent               map[string]int64 // the commands the fleet sent, by name
	cmdsBefore         int64            // the commands it sent before the first ask
	cpu0               time.Duration    // this process's CPU time before the first ask
	cpuOK              bool             // cpu0 was read
}

// redisEmpty, in a long tail on a single Redis, reads the server's memory,
// keys and clients before the fleet connects.
func (r *run) redisEmpty(ctx context.Context) {
	if r.sc.Passes > 0 && r.t.single() {
		r.tail.empty, r.tail.err = r.t.redisRead(ctx, readEmpty)
	}
}

// redisBefore resets the server's statistics and reads its CPU time and
// keys: call it just before the first ask.
func (r *run) redisBefore(ctx context.Context) {
	if r.tail.empty != nil && r.tail.err == nil {
		r.tail.reset, r.tail.err = r.t.redisRead(ctx, readReset)
	}
}

// cpuStart reads this process's CPU time just before the first ask of a
// long tail: cpuSince tells what it used from then on.
func (r *run) cpuStart() {
	if r.sc.Passes > 0 {
		r.tail.cpu0, r.tail.cpuOK = proccpu.Used()
	}
}

// cpuSince returns the CPU time this process used since cpuStart; 0 if
// either reading failed or there was none.
func (r *run) cpuSince() time.Duration {
	if !r.tail.cpuOK {
		return 0
	}
	cpu, ok := proccpu.Used()
	if !ok {
		return 0
	}
	return cpu - r.tail.cpu0
}

// redisLast reads the server's figures just after the last answer, before
// the limiters close (RedisReport.AtLastAnswer).
func (r *run) redisLast(ctx context.Context) {
	if r.tail.reset != nil && r.tail.err == nil {
		r.tail.last, r.tail.err = r.t.redisRead(ctx, readLast)
	}
}

// tailRedis reads the server's figures once the fleet's limiters and
// clients have closed and the server has seen its connections go, and sets
// rep.LongTail.Redis (or RedisError).
func (r *run) tailRedis(ctx context.Context, rep *Report) {
	lt := rep.LongTail
	if lt == nil {
		return
	}
	if r.tail.err != nil {
		lt.RedisError = r.tail.err.Error()
		return
	}
	if r.tail.last == nil {
		return
	}
	closed, err := r.readClosed(ctx)
	if err != nil {
		lt.RedisError = err.Error()
		return
	}
	red := redisReport(r.tail.empty, r.tail.reset, r.tail.last, closed)
	red.finish(r.tail.sent, rep.Decisions)
	lt.Redis = red
}

// readClosed waits for the server to count no more clients than before the
// fleet connected, and reads its figures.
func (r *run) readClosed(ctx context.Context) (*redisSnapshot, error) {
	if err := r.t.waitClients(ctx, r.tail.empty.clients); err != nil {
		return nil, err
	}
	return r.t.redisRead(ctx, readClosed)
}

// sent returns the commands the fleet has sent by name, in a long tail.
func (r *run) sent() map[string]int64 {
	m := make(map[string]int64)
	for _, in := range r.insts {
		for name, n := range in.names.snapshot() {
			m[name] += n
		}
	}
	return m
}

// single reports whether t is one real Redis, whose figures a long tail
// reads: not miniredis (which has no INFO commandstats), not a cluster.
func (t *Target) single() bool { return t.kind == kindAddr || t.kind == kindSpawned }

// emptyForTail empties a spawned redis-server before a long tail: FLUSHALL,
// so that the keys of earlier runs neither expire nor count during it, and
// SCRIPT FLUSH, so that every mode loads its scripts. A Redis that t did
// not start is left as it is (see cleanTail).
func (t *Target) emptyForTail(ctx context.Context) error {
	if t.proc == nil {
		return nil
	}
	pipe := t.clock.Pipeline()
	pipe.FlushAll(ctx)
	pipe.ScriptFlush(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bench: empty %s: %w", t, err)
	}
	return nil
}

// cleanTail deletes the keys of the run with the given prefix from a
// single Redis that t did not start, after a long tail, so that they
// neither expire nor count during the next one. (emptyForTail empties a
// spawned one before.)
func (t *Target) cleanTail(ctx context.Context, prefix string) error {
	if t.kind != kindAddr {
		return nil
	}
	var batch []string
	unlink := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := t.clock.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	it := t.clock.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		if batch = append(batch, it.Val()); len(batch) == 1000 {
			if err := unlink(); err != nil {
				return fmt.Errorf("bench: delete the keys of %s: %w", prefix, err)
			}
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bench: delete the keys of %s: %w", prefix, err)
	}
	if err := unlink(); err != nil {
		return fmt.Errorf("bench: delete the keys of %s: %w", prefix, err)
	}
	return nil
}

// nameCounter is a go-redis hook that counts the commands sent by name
// (their first word, in lower case), each command of a pipeline apart. The
// zero nameCounter is ready to use and safe for concurrent use.
type nameCounter struct {
	mu sync.Mutex // protects n
	n  map[string]int64
}

func (c *nameCounter) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = make(map[string]int64)
	}
	for _, cmd := range cmds {
		c.n[cmd.Name()]++
	}
}

// snapshot returns a copy of the counts, never nil.
func (c *nameCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int64, len(c.n))
	maps.Copy(m, c.n)
	return m
}

// DialHook passes dials through.
func (c *nameCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command.
func (c *nameCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (c *nameCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}
