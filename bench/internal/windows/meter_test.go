package windows

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// meter reads what a redis-server counts of itself, on a client of its
// own: INFO commandstats, INFO cpu, used_memory, connected_clients, DBSIZE
// and MEMORY USAGE. Its own commands are left out of the counts it
// returns.
type meter struct {
	rdb *redis.Client
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	calls, usec int64
}

// reading is the server's figures at one moment.
type reading struct {
	stats      map[string]cmdStat // since the last CONFIG RESETSTAT
	cpu        time.Duration      // used_cpu_user + used_cpu_sys
	usedMemory int64
	clients    int64
	keys       int64
}

// own are the commands the meter and the tests' setup send (and the
// connection handshakes of go-redis), as INFO commandstats names them.
var own = map[string]bool{
	"info": true, "config|resetstat": true, "dbsize": true, "flushall": true,
	"memory|usage": true, "scan": true, "ping": true, "hello": true,
	"client|setinfo": true, "script|load": true,
}

// read returns the commands and CPU time the server counted since its last
// reset, then, if reset, resets its statistics (which frees the latency
// histograms Redis 7 keeps per command called, tens of kilobytes) before it
// reads the memory, clients and keys: one pipeline.
func (m meter) read(ctx context.Context, reset bool) (reading, error) {
	pipe := m.rdb.Pipeline()
	stats, cpu := pipe.Info(ctx, "commandstats"), pipe.Info(ctx, "cpu")
	if reset {
		pipe.ConfigResetStat(ctx)
	}
	mem, clients, keys := pipe.Info(ctx, "memory"), pipe.Info(ctx, "clients"), pipe.DBSize(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return reading{}, fmt.Errorf("INFO: %w", err)
	}
	r := reading{stats: parseCommandStats(stats.Val()), keys: keys.Val()}
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		sec, err := strconv.ParseFloat(infoField(cpu.Val(), f), 64)
		if err != nil {
			return reading{}, fmt.Errorf("INFO cpu: %s: %w", f, err)
		}
		r.cpu += time.Duration(sec * float64(time.Second))
	}
	var err error
	if r.usedMemory, err = strconv.ParseInt(infoField(mem.Val(), "used_memory"), 10, 64); err != nil {
		return reading{}, fmt.Errorf("INFO memory: %w", err)
	}
	if r.clients, err = strconv.ParseInt(infoField(clients.Val(), "connected_clients"), 10, 64); err != nil {
		return reading{}, fmt.Errorf("INFO clients: %w", err)
	}
	return r, nil
}

// waitClients waits until the server counts at most n clients, for at
// most two seconds: a client closed its connections, which the server
// reads a moment later.
func (m meter) waitClients(ctx context.Context, n int64) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(2 * time.Second)
	for {
		info, err := m.rdb.Info(ctx, "clients").Result()
		if err != nil {
			return err
		}
		c, err := strconv.ParseInt(infoField(info, "connected_clients"), 10, 64)
		if err != nil || c <= n || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// memoryUsage returns the mean of MEMORY USAGE (SAMPLES 0: every element
// counted) over up to n keys that match pattern.
func (m meter) memoryUsage(ctx context.Context, pattern string, n int) (float64, error) {
	var keys []string
	it := m.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for len(keys) < n && it.Next(ctx) {
		keys = append(keys, it.Val())
	}
	if err := it.Err(); err != nil {
		return 0, err
	}
	if len(keys) == 0 {
		return 0, nil
	}
	pipe := m.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.MemoryUsage(ctx, k, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	var sum int64
	for _, c := range cmds {
		sum += c.Val()
	}
	return float64(sum) / float64(len(keys)), nil
}

// flush empties the server, and frees the memory before it answers.
func (m meter) flush(ctx context.Context) error {
	return m.rdb.FlushAll(ctx).Err()
}

// cost is what the server counted between two readings for d decisions,
// less the meter's own commands.
type cost struct {
	decisions int64
	calls     int64 // every command, those run inside scripts and MULTI included
	sent      int64 // the commands named top (those the clients sent)
	scripts   int64 // evalsha and eval
	usec      int64 // Redis's time in the top commands
	cpu       time.Duration
	byName    map[string]cmdStat
}

// costOf returns the cost between a reading just after a reset and a later
// one, top being the commands the clients sent.
func costOf(from, to reading, top []string, decisions int64) cost {
	c := cost{decisions: decisions, cpu: to.cpu - from.cpu, byName: make(map[string]cmdStat)}
	for name, s := range to.stats {
		if own[name] {
			continue
		}
		c.byName[name] = s
		c.calls += s.calls
		for _, t := range top {
			if name == t {
				c.sent += s.calls
				c.usec += s.usec
			}
		}
		if name == "evalsha" || name == "eval" {
			c.scripts += s.calls
		}
	}
	return c
}

// per returns n per decision.
func (c cost) per(n int64) float64 {
	if c.decisions == 0 {
		return 0
	}
	return float64(n) / float64(c.decisions)
}

// usecPerCall returns INFO commandstats' usec_per_call of the script
// commands, or of all the top commands for a client that sends no script.
func (c cost) usecPerCall() float64 {
	if c.scripts > 0 {
		s, e := c.byName["evalsha"], c.byName["eval"]
		return float64(s.usec+e.usec) / float64(s.calls+e.calls)
	}
	if c.sent == 0 {
		return 0
	}
	return float64(c.usec) / float64(c.sent)
}

// parseCommandStats parses INFO commandstats: lines such as
// "cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,...".
func parseCommandStats(info string) map[string]cmdStat {
	m := make(map[string]cmdStat)
	for line := range strings.Lines(info) {
		name, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		name, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var c cmdStat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				c.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				c.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		m[name] = c
	}
	return m
}

// infoField returns the value of key in an INFO reply, "" if none.
func infoField(info, key string) string {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == key {
			return v
		}
	}
	return ""
}
