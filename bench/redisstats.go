package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a long tail costs Redis, as the server itself counts it. Four
// readings, each of its figures at once, in one pipeline:
//
//  1. before the fleet connects: CONFIG RESETSTAT, then used_memory,
//     connected_clients and DBSIZE;
//  2. just before the first ask: CONFIG RESETSTAT, then the CPU time and
//     DBSIZE;
//  3. just after the last answer, before the limiters close: INFO
//     commandstats, the CPU time and DBSIZE (RedisReport.AtLastAnswer);
//  4. once the limiters and clients have closed and the server has seen
//     the fleet's connections go: INFO commandstats and the CPU time, then
//     CONFIG RESETSTAT, used_memory and DBSIZE.
//
// Commands and CPU time run from 2 to 4, so that what the limiters settle
// when they close counts. Memory and keys run from 1 to 4, two moments
// alike: the same connections open (each costs the server tens of
// kilobytes, which mem_clients_normal tells only once clientsCron has come
// round), and the statistics just reset (Redis 7 keeps a latency histogram
// of tens of kilobytes for each command called since, which CONFIG
// RESETSTAT frees). The bench's own commands (those of the Target's clock
// client) are taken out of the counts.

// scriptCommands are the commands that run a script, as INFO commandstats
// names them.
var scriptCommands = map[string]bool{
	"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true,
}

// CommandStat is one line of INFO commandstats: the calls of a command and
// the microseconds Redis spent in them.
type CommandStat struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"usec"`
}

// RedisReport is what a run cost Redis, as the server counts it, from just
// before the first ask until the limiters have closed (what they settle
// then, such as optimistic charges and lease give-backs, is part of the
// cost of the decisions), less the commands the bench itself sent. It
// assumes that nothing else used the server meanwhile.
type RedisReport struct {
	// Commands is INFO commandstats by command, named as Redis names them
	// (such as "evalsha" or "client|setinfo"). Redis counts the commands
	// that scripts call too, each on its own line.
	Commands map[string]CommandStat `json:"commands"`
	// ScriptCalls counts the calls of eval, evalsha, eval_ro, evalsha_ro,
	// fcall and fcall_ro; ScriptUsec is Redis's time in them, that of the
	// commands they called included.
	ScriptCalls int64 `json:"script_calls"`
	ScriptUsec  int64 `json:"script_usec"`
	// Calls counts every command Redis ran, those that scripts called
	// included.
	Calls int64 `json:"calls"`
	// Sent counts the commands among them that the clients sent, that is
	// Calls less those called from scripts (a hook on each client counts
	// them by name; a script call is always one); SentUsec is Redis's time
	// in them, each command counted once: a script's time includes that of
	// what it called.
	Sent     int64 `json:"sent"`
	SentUsec int64 `json:"sent_usec"`
	// CPU is the CPU time of the redis-server process (used_cpu_user plus
	// used_cpu_sys): the commands and all else, reading requests and
	// writing replies included.
	CPU time.Duration `json:"cpu_ns"`
	// UsedMemory is the growth of used_memory in bytes, and Keys that of
	// DBSIZE, from before the fleet connected to after it disconnected:
	// the keys as they stay in Redis once the fleet has settled them.
	UsedMemory int64 `json:"used_memory_bytes"`
	Keys       int64 `json:"keys"`
	// AtLastAnswer is what the server counted from just before the first
	// ask to just after the last answer, before the limiters closed:
	// leases not given back yet, optimistic spends not charged yet.
	AtLastAnswer RedisReading `json:"at_last_answer"`

	// The figures per decision: script calls, commands, Redis's time in
	// the script commands and in all the commands sent (µs), CPU time
	// (µs).
	ScriptsPerDecision    float64 `json:"script_calls_per_decision"`
	CallsPerDecision      float64 `json:"calls_per_decision"`
	ScriptUsecPerDecision float64 `json:"script_usec_per_decision"`
	SentUsecPerDecision   float64 `json:"sent_usec_per_decision"`
	CPUPerDecision        float64 `json:"cpu_usec_per_decision"`
	// MemPerKey is UsedMemory over Keys, 0 if no key was left.
	MemPerKey float64 `json:"used_memory_per_key"`
}

// RedisReading is what the server counted from just before the first ask
// to some moment of a run, less the bench's own commands: script calls and
// their time, all the commands, CPU time, and the growth of DBSIZE.
type RedisReading struct {
	ScriptCalls int64         `json:"script_calls"`
	ScriptUsec  int64         `json:"script_usec"`
	Calls       int64         `json:"calls"`
	CPU         time.Duration `json:"cpu_ns"`
	Keys        int64         `json:"keys"`
}

// finish sets r's Sent and SentUsec from the commands the clients sent by
// name, and the figures per decision.
func (r *RedisReport) finish(sent map[string]int64, decisions int64) {
	avail := make(map[string]int64, len(sent))
	maps.Copy(avail, sent)
	r.Sent, r.SentUsec = 0, 0
	for _, name := range slices.Sorted(maps.Keys(r.Commands)) {
		c := r.Commands[name]
		n := c.Calls
		if !scriptCommands[name] {
			base, _, _ := strings.Cut(name, "|")
			n = min(n, avail[base])
			avail[base] -= n
		}
		r.Sent += n
		if c.Calls > 0 {
			r.SentUsec += c.Usec * n / c.Calls
		}
	}
	if decisions > 0 {
		d := float64(decisions)
		r.ScriptsPerDecision = float64(r.ScriptCalls) / d
		r.CallsPerDecision = float64(r.Calls) / d
		r.ScriptUsecPerDecision = float64(r.ScriptUsec) / d
		r.SentUsecPerDecision = float64(r.SentUsec) / d
		r.CPUPerDecision = float64(r.CPU.Microseconds()) / d
	}
	if r.Keys > 0 {
		r.MemPerKey = float64(r.UsedMemory) / float64(r.Keys)
	}
}

// redisSnapshot is one reading of the server's figures; each holds those
// of its kind (see redisRead).
type redisSnapshot struct {
	own        map[string]int64       // the clock client's commands so far, by name
	stats      map[string]CommandStat // INFO commandstats
	usedMemory int64
	cpu        time.Duration
	keys       int64
	clients    int64 // connected_clients
}

// The kinds of reading.
const (
	readEmpty  = iota // CONFIG RESETSTAT, then memory, clients and keys
	readReset         // CONFIG RESETSTAT, then CPU time and keys
	readLast          // commandstats, CPU time and keys
	readClosed        // commandstats and CPU time; CONFIG RESETSTAT, then memory and keys
)

// redisRead reads the server's figures of a kind, at once, in one
// pipeline on the clock client.
func (t *Target) redisRead(ctx context.Context, kind int) (*redisSnapshot, error) {
	s := &redisSnapshot{own: t.own.snapshot()}
	pipe := t.clock.Pipeline()
	var stats, mem, cpu, clients *redis.StringCmd
	switch kind {
	case readEmpty:
		pipe.ConfigResetStat(ctx)
		mem, clients = pipe.Info(ctx, "memory"), pipe.Info(ctx, "clients")
	case readReset:
		pipe.ConfigResetStat(ctx)
		cpu = pipe.Info(ctx, "cpu")
	case readLast:
		stats, cpu = pipe.Info(ctx, "commandstats"), pipe.Info(ctx, "cpu")
	case readClosed:
		stats, cpu = pipe.Info(ctx, "commandstats"), pipe.Info(ctx, "cpu")
		pipe.ConfigResetStat(ctx)
		mem = pipe.Info(ctx, "memory")
	}
	keys := pipe.DBSize(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("bench: Redis statistics: %w", err)
	}
	s.keys = keys.Val()
	var err error
	if stats != nil {
		s.stats = parseCommandStats(stats.Val())
	}
	if mem != nil {
		if s.usedMemory, err = infoInt(mem.Val(), "used_memory"); err != nil {
			return nil, err
		}
	}
	if clients != nil {
		if s.clients, err = infoInt(clients.Val(), "connected_clients"); err != nil {
			return nil, err
		}
	}
	if cpu != nil {
		for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
			v, _ := infoField(cpu.Val(), f)
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("bench: INFO cpu: no %s", f)
			}
			s.cpu += time.Duration(sec * float64(time.Second))
		}
	}
	return s, nil
}

// clientsWait bounds the wait for the server to see the fleet's
// connections close.
const clientsWait = 2 * time.Second

// waitClients waits until the server counts at most n connected clients,
// or clientsWait has passed: the fleet has closed its connections, but the
// server may not have read that yet.
func (t *Target) waitClients(ctx context.Context, n int64) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(clientsWait)
	for {
		info, err := t.clock.Info(ctx, "clients").Result()
		if err != nil {
			return fmt.Errorf("bench: INFO clients: %w", err)
		}
		if c, err := infoInt(info, "connected_clients"); err != nil || c <= n || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// redisReport returns what the server counted: commands and CPU time from
// reset to closed (and to last, for AtLastAnswer), memory and keys from
// empty to closed; less the commands of the Target's clock client (the
// bench's own). The report's Sent and per-decision figures are left to
// finish.
func redisReport(empty, reset, last, closed *redisSnapshot) *RedisReport {
	cmds := counted(reset, closed)
	end := reading(reset, closed, cmds)
	return &RedisReport{
		Commands:     cmds,
		ScriptCalls:  end.ScriptCalls,
		ScriptUsec:   end.ScriptUsec,
		Calls:        end.Calls,
		CPU:          end.CPU,
		UsedMemory:   closed.usedMemory - empty.usedMemory,
		Keys:         closed.keys - empty.keys,
		AtLastAnswer: reading(reset, last, counted(reset, last)),
	}
}

// reading returns the figures of s since reset, its commands being cmds.
func reading(reset, s *redisSnapshot, cmds map[string]CommandStat) RedisReading {
	rd := RedisReading{CPU: s.cpu - reset.cpu, Keys: s.keys - reset.keys}
	for name, c := range cmds {
		rd.Calls += c.Calls
		if scriptCommands[name] {
			rd.ScriptCalls += c.Calls
			rd.ScriptUsec += c.Usec
		}
	}
	return rd
}

// counted returns the commandstats of s, which the server counted since
// reset (its CONFIG RESETSTAT, which counts itself), less the commands of
// the clock client from reset to s.
func counted(reset, s *redisSnapshot) map[string]CommandStat {
	own := make(map[string]int64, len(s.own))
	for name, n := range s.own {
		own[name] = n - reset.own[name]
	}
	m := make(map[string]CommandStat)
	for _, name := range slices.Sorted(maps.Keys(s.stats)) {
		c := s.stats[name]
		base, _, _ := strings.Cut(name, "|")
		if n := min(c.Calls, own[base]); n > 0 { // the bench's own
			own[base] -= n
			c.Usec -= c.Usec * n / c.Calls
			c.Calls -= n
		}
		if c.Calls > 0 {
			m[name] = c
		}
	}
	return m
}

// parseCommandStats parses INFO commandstats: lines such as
// "cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,...".
func parseCommandStats(info string) map[string]CommandStat {
	m := make(map[string]CommandStat)
	for line := range strings.Lines(info) {
		name, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		name, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var c CommandStat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				c.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				c.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		m[name] = c
	}
	return m
}

// infoField returns the value of key in an INFO reply.
func infoField(info, key string) (string, bool) {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// infoInt returns the integer value of key in an INFO reply.
func infoInt(info, key string) (int64, error) {
	v, _ := infoField(info, key)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: INFO: no %s", key)
	}
	return n, nil
}
