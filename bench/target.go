package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// targetKind is what a Target points at.
type targetKind uint8

const (
	kindMiniredis targetKind = iota
	kindAddr
	kindCluster
	kindSpawned
)

// Target is the Redis a run uses: an embedded miniredis, a Redis or a Redis
// Cluster given by loopback address, or a redis-server process started here.
// A Target serves any number of runs, one after another or at once (each
// run keeps its keys under a prefix of its own). Create one with Miniredis,
// Dial, DialCluster or SpawnRedis, and Close it when done; what it started,
// it stops. Its methods are safe for concurrent use.
type Target struct {
	kind  targetKind
	addrs []string
	mini  *miniredis.Miniredis   // kindMiniredis: owned
	proc  *redistest.Proc        // kindSpawned: owned
	clust *redistest.ClusterProc // kindCluster, if spawned: owned
	clock redis.UniversalClient  // direct, whatever the latency
	own   nameCounter            // the clock client's commands: the bench's own
	runs  atomic.Uint64          // runs started, for key prefixes

	// Set by AddLatency, before any run.
	via                 map[string]string // node address -> its proxy's; nil: direct
	proxy               *proxyProc        // owned
	latency             time.Duration     // the round trip added
	pingVia, pingDirect time.Duration     // PING's median through the proxy and direct

	outMu sync.Mutex // serializes down and up

	closed atomic.Bool
}

// Miniredis starts an embedded miniredis on a loopback port and returns a
// Target that owns it. miniredis runs Lua scripts much more slowly than
// redis-server (about 20 times), so modes that call a script per decision
// reach a lower rate on it.
func Miniredis() (*Target, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("bench: start miniredis: %w", err)
	}
	return open(&Target{kind: kindMiniredis, addrs: []string{m.Addr()}, mini: m})
}

// Dial returns a Target for the Redis at addr, which must be a loopback
// address and answer PING. Runs leave their keys there; they expire when
// their buckets would be full again.
func Dial(addr string) (*Target, error) {
	if err := redistest.CheckLoopback(addr); err != nil {
		return nil, err
	}
	return open(&Target{kind: kindAddr, addrs: []string{addr}})
}

// DialCluster returns a Target for the Redis Cluster whose nodes include
// addrs, all loopback addresses. Nodes the cluster announces on other
// addresses are refused.
func DialCluster(addrs []string) (*Target, error) {
	if len(addrs) == 0 {
		return nil, errors.New("bench: no cluster address")
	}
	for _, a := range addrs {
		if err := redistest.CheckLoopback(a); err != nil {
			return nil, err
		}
	}
	return open(&Target{kind: kindCluster, addrs: append([]string(nil), addrs...)})
}

// SpawnRedis starts a redis-server (from PATH) on a free loopback port,
// without persistence, and returns a Target that owns it: Close stops it.
func SpawnRedis() (*Target, error) {
	p, err := redistest.Start(redistest.Options{})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return open(&Target{kind: kindSpawned, addrs: []string{p.Addr()}, proc: p})
}

// SpawnCluster starts a Redis Cluster of three masters (redis-server and
// redis-cli from PATH) on free loopback ports, without persistence, and
// returns a Target that owns it: Close stops it. It cannot be taken down by
// an Outage.
func SpawnCluster() (*Target, error) {
	c, err := redistest.StartCluster(redistest.ClusterOptions{})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return open(&Target{kind: kindCluster, addrs: c.Addrs(), clust: c})
}

// open connects t's clock client, which dials direct, and checks that Redis
// answers. On failure it stops what t owns.
func open(t *Target) (*Target, error) {
	t.clock = t.newClient(&t.own, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.clock.Ping(ctx).Err(); err != nil {
		t.Close()
		return nil, fmt.Errorf("bench: %s does not answer PING: %w", t, err)
	}
	return t, nil
}

// Real reports whether t is a real Redis (not miniredis): the redis_rate
// mode needs one.
func (t *Target) Real() bool { return t.kind != kindMiniredis }

// Owned reports whether t started the Redis it points at (the embedded
// miniredis or a spawned redis-server), and so can take it down and bring
// it back: a Scenario with an Outage needs one.
func (t *Target) Owned() bool { return t.mini != nil || t.proc != nil }

// down takes t's Redis away: it closes the miniredis, or kills the
// redis-server with SIGKILL, like a crash.
func (t *Target) down() error {
	t.outMu.Lock()
	defer t.outMu.Unlock()
	switch {
	case t.mini != nil:
		t.mini.Close()
		return nil
	case t.proc != nil:
		if err := t.proc.Kill(); err != nil {
			return fmt.Errorf("bench: outage: %w", err)
		}
		return nil
	}
	return ErrNotOwned
}

// up brings t's Redis back, on the same address and empty: the miniredis
// is restarted and flushed, the redis-server started again (it keeps no
// data). It then pings through t's clock client until it answers, so that
// connections broken by the outage are dropped from its pool.
func (t *Target) up(ctx context.Context) error {
	t.outMu.Lock()
	defer t.outMu.Unlock()
	switch {
	case t.mini != nil:
		if err := t.mini.Restart(); err != nil {
			return fmt.Errorf("bench: outage: restart miniredis: %w", err)
		}
		t.mini.FlushAll()
	case t.proc != nil:
		if err := t.proc.Restart(); err != nil {
			return fmt.Errorf("bench: outage: %w", err)
		}
	default:
		return ErrNotOwned
	}
	var err error
	for range 5 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err = t.clock.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("bench: outage: Redis back but no answer to PING: %w", err)
}

// String describes t, e.g. "redis-server 127.0.0.1:40113 (spawned)", and
// the latency added: ", via a proxy adding 1ms round trip (PING 1.1ms
// through it, 40µs direct)".
func (t *Target) String() string {
	s := t.where()
	if t.latency > 0 {
		s += fmt.Sprintf(", via a proxy adding %v round trip (PING %s through it, %s direct)", t.latency, fmtDuration(t.pingVia), fmtDuration(t.pingDirect))
	}
	return s
}

// where describes the Redis t points at.
func (t *Target) where() string {
	switch t.kind {
	case kindMiniredis:
		return "miniredis " + t.addrs[0] + " (embedded)"
	case kindAddr:
		return "redis " + t.addrs[0]
	case kindCluster:
		if t.clust != nil {
			return "3-master cluster " + strings.Join(t.addrs, ",") + " (spawned)"
		}
		return "cluster " + strings.Join(t.addrs, ",")
	default:
		return "redis-server " + t.addrs[0] + " (spawned)"
	}
}

// Close closes t's client and stops the miniredis or redis-server that t
// started. Closing twice does nothing.
func (t *Target) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	var err error
	if t.clock != nil {
		err = t.clock.Close()
	}
	if t.mini != nil {
		t.mini.Close()
	}
	if t.proc != nil {
		err = errors.Join(err, t.proc.Stop())
	}
	if t.clust != nil {
		err = errors.Join(err, t.clust.Stop())
	}
	if t.proxy != nil {
		err = errors.Join(err, t.proxy.stop())
	}
	return err
}

// now returns the Redis clock: TIME, or for miniredis (whose TIME and
// scripts read time.Now) the local clock.
func (t *Target) now(ctx context.Context) (time.Time, error) {
	if t.kind == kindMiniredis {
		return time.Now(), nil
	}
	now, err := t.clock.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("bench: TIME: %w", err)
	}
	return now, nil
}

// prefix returns a Redis key prefix no other run on t has used, and that no
// earlier process used either (it holds the start time).
func (t *Target) prefix(mode string) string {
	return fmt.Sprintf("bench-%x-%d-%s", time.Now().UnixNano(), t.runs.Add(1), mode)
}

// client returns a new client of the fleet on t, through the proxy if t
// has latency (see newClient).
func (t *Target) client(hook redis.Hook) redis.UniversalClient {
	return t.newClient(hook, t.via)
}

// newClient returns a new client of t, the way the limiter wants it:
// nothing sent twice (MaxRetries -1) and the callers' deadlines honoured.
// It dials each node through its proxy in via, if via is not nil. hook, if
// not nil, sees every command.
func (t *Target) newClient(hook redis.Hook, via map[string]string) redis.UniversalClient {
	var rdb redis.UniversalClient
	noMaint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if t.kind == kindCluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                    t.addrs,
			Dialer:                   viaDialer(via),
			MaxRetries:               -1,
			ContextTimeoutEnabled:    true,
			MaintNotificationsConfig: noMaint,
		})
	} else {
		rdb = redis.NewClient(&redis.Options{
			Addr:                     t.addrs[0],
			Dialer:                   viaDialer(via),
			MaxRetries:               -1,
			ContextTimeoutEnabled:    true,
			MaintNotificationsConfig: noMaint,
		})
	}
	if hook != nil {
		rdb.AddHook(hook)
	}
	return rdb
}
