package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Environment variables read by the test wrappers.
const (
	// EnvRequire set to "1" turns a missing redis-server or redis-cli into a
	// test failure instead of a skip. CI sets it.
	EnvRequire = "HYBRID_REQUIRE_REDIS"
	// EnvAddr names an existing loopback Redis for Server to use instead of
	// starting one, e.g. "127.0.0.1:6379".
	EnvAddr = "REDIS_ADDR"
	// EnvClusterAddrs names the nodes of an existing loopback Redis Cluster,
	// comma separated, for Cluster to use instead of starting one.
	EnvClusterAddrs = "REDIS_CLUSTER_ADDRS"
)

// Required reports whether tests must not skip for lack of Redis, that is
// whether HYBRID_REQUIRE_REDIS is "1".
func Required() bool { return os.Getenv(EnvRequire) == "1" }

// Server returns a redis-server for tb, stopped at cleanup. If REDIS_ADDR is
// set it returns that server instead, which it does not own (Owned is false)
// and which tests share: use keys of your own there. Without redis-server on
// PATH it skips tb, or fails it when Required.
func Server(tb testing.TB) *Proc {
	tb.Helper()
	if addr := os.Getenv(EnvAddr); addr != "" {
		return externalServer(tb, EnvAddr, addr)
	}
	need(tb, "redis-server")
	p, err := Start(Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// Cluster returns a 3-node Redis Cluster for tb, stopped at cleanup. If
// REDIS_CLUSTER_ADDRS is set it returns that cluster instead, which it does
// not own. Without redis-server and redis-cli on PATH it skips tb, or fails
// it when Required.
func Cluster(tb testing.TB) *ClusterProc {
	tb.Helper()
	return ClusterWith(tb, ClusterOptions{})
}

// ClusterWith is Cluster with opts for a cluster it starts, such as
// Replicas 1 for three masters with a replica each (a cluster from
// REDIS_CLUSTER_ADDRS is returned as it is, whatever opts say: a test that
// needs replicas or kills nodes should skip unless Owned).
func ClusterWith(tb testing.TB, opts ClusterOptions) *ClusterProc {
	tb.Helper()
	if list := os.Getenv(EnvClusterAddrs); list != "" {
		var addrs []string
		for _, addr := range strings.Split(list, ",") {
			if addr = strings.TrimSpace(addr); addr != "" {
				if err := CheckLoopback(addr); err != nil {
					tb.Fatalf("%v (from %s)", err, EnvClusterAddrs)
				}
				addrs = append(addrs, addr)
			}
		}
		if len(addrs) == 0 {
			tb.Fatalf("redistest: %s=%q names no address", EnvClusterAddrs, list)
		}
		c := &ClusterProc{}
		for _, addr := range addrs {
			c.nodes = append(c.nodes, externalServer(tb, EnvClusterAddrs, addr))
		}
		return c
	}
	need(tb, "redis-server", "redis-cli")
	c, err := StartCluster(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// Sentinel returns a master with two replicas and three sentinels for tb
// (StartSentinel), stopped at cleanup. It always starts its own. Without
// redis-server on PATH it skips tb, or fails it when Required; redis-sentinel
// is used when on PATH but not needed.
func Sentinel(tb testing.TB) *SentinelProc {
	tb.Helper()
	return SentinelWith(tb, SentinelOptions{})
}

// SentinelWith is Sentinel with opts.
func SentinelWith(tb testing.TB, opts SentinelOptions) *SentinelProc {
	tb.Helper()
	need(tb, "redis-server")
	s, err := StartSentinel(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// FailoverClient returns a go-redis failover client of s, which finds the
// master through the sentinels, closed at cleanup. It does not retry
// (MaxRetries -1), so a command sent while the master is down fails; and it
// dials the sentinels and the master they name through LoopbackDialer, which
// go-redis uses for both. go-redis disables maintenance notifications on
// its own for failover clients (FailoverOptions has no field for them).
func FailoverClient(tb testing.TB, s *SentinelProc) *redis.Client {
	tb.Helper()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            MasterName,
		SentinelAddrs:         s.SentinelAddrs(),
		Dialer:                LoopbackDialer(5 * time.Second),
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { rdb.Close() })
	return rdb
}

// Client returns a client of p, closed at cleanup.
func Client(tb testing.TB, p *Proc) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:                     p.Addr(),
		Dialer:                   LoopbackDialer(5 * time.Second),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	tb.Cleanup(func() { rdb.Close() })
	return rdb
}

// ClusterClient returns a cluster client of c, closed at cleanup. It refuses
// to connect to a node the cluster announces on a non-loopback address.
func ClusterClient(tb testing.TB, c *ClusterProc) *redis.ClusterClient {
	tb.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    c.Addrs(),
		Dialer:                   LoopbackDialer(5 * time.Second),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	tb.Cleanup(func() { rdb.Close() })
	return rdb
}

// externalServer checks that addr, from the environment variable env, is a
// loopback address that answers PING, and returns a Proc for it.
func externalServer(tb testing.TB, env, addr string) *Proc {
	tb.Helper()
	if err := CheckLoopback(addr); err != nil {
		tb.Fatalf("%v (from %s)", err, env)
	}
	if _, err := command(addr, 5*time.Second, "PING"); err != nil {
		tb.Fatalf("redistest: %s from %s does not answer PING: %v", addr, env, err)
	}
	return external(addr)
}

// need skips tb, or fails it when Required, unless every binary is on PATH.
func need(tb testing.TB, bins ...string) {
	tb.Helper()
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("redistest: %s not found on PATH; install Redis (Debian: apt-get install redis-server redis-tools) or set %s / %s to a loopback Redis", bin, EnvAddr, EnvClusterAddrs)
			if Required() {
				tb.Fatal(msg + "; not skipping because " + EnvRequire + "=1")
			}
			tb.Skip(msg)
		}
	}
}

// ClosedAddr returns an address on 127.0.0.1 that nothing listens on: a
// Redis that refuses every connection (ECONNREFUSED), as a dead one does.
func ClosedAddr(tb testing.TB) string {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
