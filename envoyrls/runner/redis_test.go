package runner_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/envoyrls/runner"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// startEnv starts a Service as start does, on the Redis that the
// environment env describes, read by FromEnv.
func startEnv(t *testing.T, env ...string) *svc {
	t.Helper()
	cfg, err := runner.FromEnv(env)
	if err != nil {
		t.Fatalf("FromEnv: %v", err)
	}
	return start(t, testYAML, func(c *runner.Config) { c.Redis = cfg.Redis })
}

// checkDecides checks that v decides k=v with its Redis: 3 calls
// allowed, the fourth over the limit, and no warning that Redis does not
// answer.
func checkDecides(t *testing.T, v *svc) {
	t.Helper()
	got := v.codes(4)
	if got[0] != ok || got[1] != ok || got[2] != ok || got[3] != over {
		t.Errorf("codes %v, want OK OK OK OVER_LIMIT", got)
	}
	if log := v.logs.String(); strings.Contains(log, "does not answer") {
		t.Errorf("Redis did not answer:\n%s", log)
	}
}

// checkKeys checks that rdb holds buckets of the Limiter.
func checkKeys(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, "hybrid:{*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("KEYS hybrid:{*: %v, %v; want the bucket of k=v", keys, err)
	}
}

// TestRedisTLS: REDIS_TLS with the CA and client certificate files, and
// REDIS_AUTH in its user:password form, reach a Redis that requires both.
func TestRedisTLS(t *testing.T) {
	certs, err := redistest.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := redistest.AuthServer(t, redistest.AuthOptions{
		Password: "admin-pass",
		Users:    []redistest.User{{Name: "rl", Password: "rl-pass", Rules: []string{"~*", "+@all"}}},
		TLS:      certs,
	})
	v := startEnv(t,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+p.TLSAddr(), "REDIS_AUTH=rl:rl-pass",
		"REDIS_TLS=true", "REDIS_TLS_CACERT="+certs.CAFile,
		"REDIS_TLS_CLIENT_CERT="+certs.ClientCertFile, "REDIS_TLS_CLIENT_KEY="+certs.ClientKeyFile,
	)
	checkDecides(t, v)
	admin := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: "admin-pass", Dialer: redistest.LoopbackDialer(5 * time.Second)})
	defer admin.Close()
	checkKeys(t, admin)
}

// TestRedisURL: REDIS_URL as a redis:// URL with its credentials.
func TestRedisURL(t *testing.T) {
	p := redistest.AuthServer(t, redistest.AuthOptions{Password: "pw"})
	v := startEnv(t, "REDIS_URL=redis://:pw@"+p.Addr()+"/0")
	checkDecides(t, v)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: "pw", Dialer: redistest.LoopbackDialer(5 * time.Second)})
	defer rdb.Close()
	checkKeys(t, rdb)
}

// TestRedisSentinel: REDIS_TYPE=sentinel reads REDIS_URL as the original
// does: the master's name, then the sentinels.
func TestRedisSentinel(t *testing.T) {
	s := redistest.Sentinel(t)
	v := startEnv(t, "REDIS_TYPE=sentinel", "REDIS_URL="+redistest.MasterName+","+strings.Join(s.SentinelAddrs(), ","))
	checkDecides(t, v)
	checkKeys(t, redistest.FailoverClient(t, s))
}

// TestRedisCluster: REDIS_TYPE=cluster reads REDIS_URL as the nodes.
func TestRedisCluster(t *testing.T) {
	c := redistest.Cluster(t)
	v := startEnv(t, "REDIS_TYPE=cluster", "REDIS_URL="+strings.Join(c.Addrs(), ","))
	checkDecides(t, v)
	rdb := redistest.ClusterClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var found atomic.Int64 // the masters are read at once
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, "hybrid:{*").Result()
		found.Add(int64(len(keys)))
		return err
	})
	if err != nil || found.Load() == 0 {
		t.Errorf("the cluster holds %d buckets (%v); want the bucket of k=v", found.Load(), err)
	}
}

// TestRedisSocketTypeHint: a host:port with the original's default socket
// type, unix, is dialled as a socket's path, as there; the service starts
// (the fallback decides), and its log says what to set.
func TestRedisSocketTypeHint(t *testing.T) {
	v := startEnv(t, "REDIS_URL=127.0.0.1:1")
	if log := v.logs.String(); !strings.Contains(log, "Redis does not answer") || !strings.Contains(log, "REDIS_SOCKET_TYPE is unix") {
		t.Errorf("no hint about REDIS_SOCKET_TYPE in the log:\n%s", log)
	}
	// Close says that the Limiter could not settle with Redis.
	if err := v.close(); err == nil || !strings.Contains(err.Error(), "closing the limiter") {
		t.Errorf("Close with Redis unreachable: %v, want the Limiter's error", err)
	}
	v.close = func() error { return nil }
}
