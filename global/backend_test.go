package global_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// t0 is the miniredis clock at the start of a test.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// backend is a Redis under test.
type backend struct {
	rdb redis.UniversalClient
	m   *miniredis.Miniredis // nil on a real server, whose clock runs
	log *cmdLog              // the script commands rdb sent
}

// newMiniredis returns a miniredis backend with its clock at t0.
func newMiniredis(t testing.TB) backend {
	m := miniredis.RunT(t)
	m.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{
		Addr: m.Addr(),
		// miniredis does not know CLIENT MAINT_NOTIFICATIONS.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	log := &cmdLog{}
	rdb.AddHook(log)
	return backend{rdb: rdb, m: m, log: log}
}

// eachBackend runs f on miniredis, on a real redis-server and on a real
// 3-master Redis Cluster. The real ones skip without redis-server unless
// HYBRID_REQUIRE_REDIS=1.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("miniredis", func(t *testing.T) {
		f(t, newMiniredis(t))
	})
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Client(t, redistest.Server(t))
		log := &cmdLog{}
		rdb.AddHook(log)
		f(t, backend{rdb: rdb, log: log})
	})
	t.Run("cluster", func(t *testing.T) {
		rdb := redistest.ClusterClient(t, redistest.Cluster(t))
		log := &cmdLog{}
		rdb.AddHook(log)
		f(t, backend{rdb: rdb, log: log})
	})
}

// newLimiter returns a Limiter on b with a prefix of its own, so that tests
// sharing a server (REDIS_ADDR) do not meet.
func newLimiter(t testing.TB, b backend) *global.Limiter {
	t.Helper()
	l, err := global.New(b.rdb, global.Config{Prefix: fmt.Sprintf("test%d", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// redisNow returns the Redis time on the node of the Redis key rkey.
func redisNow(ctx context.Context, t testing.TB, rdb redis.UniversalClient, rkey string) time.Time {
	t.Helper()
	v, err := rdb.Eval(ctx, "local t = redis.call('TIME') return t[1] * 1000000 + t[2]", []string{rkey}).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMicro(v)
}

// ttl returns the TTL of the Redis key rkey: exact on miniredis, whose TTLs
// stand still while its clock is set.
func (b backend) ttl(ctx context.Context, t testing.TB, rkey string) time.Duration {
	t.Helper()
	if b.m != nil {
		return b.m.TTL(rkey)
	}
	d, err := b.rdb.PTTL(ctx, rkey).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// cmdLog is a go-redis hook that records the name and outcome of every
// EVAL and EVALSHA, in pipelines too. It is safe for concurrent use.
type cmdLog struct {
	mu   sync.Mutex // protects cmds
	cmds []string   // "evalsha", "evalsha NOSCRIPT", "eval", ...
}

func (h *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.add(cmd, err) // here cmd.Err() is not set yet
		return err
	}
}

func (h *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.add(cmd, cmd.Err())
		}
		return err
	}
}

func (h *cmdLog) add(cmd redis.Cmder, err error) {
	name := cmd.Name()
	if name != "eval" && name != "evalsha" {
		return
	}
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		name += " NOSCRIPT"
	}
	h.mu.Lock()
	h.cmds = append(h.cmds, name)
	h.mu.Unlock()
}

// take returns the commands recorded since the last take, counted by name:
// "evalsha NOSCRIPT=3 eval=3".
func (h *cmdLog) take() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var order []string
	n := map[string]int{}
	for _, c := range h.cmds {
		if n[c] == 0 {
			order = append(order, c)
		}
		n[c]++
	}
	h.cmds = h.cmds[:0]
	var s []string
	for _, c := range order {
		s = append(s, fmt.Sprintf("%s=%d", c, n[c]))
	}
	return strings.Join(s, " ")
}
