package hybridprom_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/hybridprom"
	"github.com/hybridlimit/hybrid/reconcile"
)

// link is a go-redis hook between a Limiter and miniredis: it sets Redis TIME
// to the caller's clock (in a synctest bubble, the bubble's) plus offset
// before every command, and can cut the link, failing every command as a
// refused connection would.
type link struct {
	m      *miniredis.Miniredis
	offset time.Duration
	down   atomic.Bool
}

var errDown = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func (l *link) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *link) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if l.down.Load() {
			cmd.SetErr(errDown)
			return errDown
		}
		l.m.SetTime(time.Now().Add(l.offset))
		return next(ctx, cmd)
	}
}

func (l *link) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if l.down.Load() {
			for _, c := range cmds {
				c.SetErr(errDown)
			}
			return errDown
		}
		l.m.SetTime(time.Now().Add(l.offset))
		return next(ctx, cmds)
	}
}

// settle sleeps for d of the bubble's time and waits for the goroutines that
// woke meanwhile: the rounds due within d are done.
func settle(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// TestCollector: after real traffic on miniredis, with an outage in the
// middle and Redis's clock 2s ahead, the metrics say what happened: the
// decisions by source and outcome, the breaker's transitions and state, the
// outage's consumption charged, the fleet, the skew, the extra counters; the
// round-trip histogram agrees with the Stats; the metrics pass the Prometheus
// linter and a pedantic registry.
func TestCollector(t *testing.T) {
	m := miniredis.RunT(t)
	synctest.Test(t, func(t *testing.T) {
		ln := &link{m: m, offset: 2 * time.Second}
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		rdb.AddHook(ln)
		defer rdb.Close()
		lim, err := hybrid.New(rdb, hybrid.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close(context.Background())
		var shadow atomic.Uint64
		c, err := hybridprom.New(lim, hybridprom.Config{
			ConstLabels: prometheus.Labels{"limiter": "api"},
			Extras: []hybridprom.Extra{{
				Name:  "http_decisions_total",
				Help:  "Decisions of the HTTP middleware.",
				Label: "outcome",
				Read: func() map[string]uint64 {
					return map[string]uint64{"shadow_denied": shadow.Load(), "denied": 2}
				},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		settle(time.Millisecond)

		ctx := context.Background()
		allow := func(key string, l hybrid.Limit, allowed bool, src hybrid.Source) {
			t.Helper()
			res, err := lim.Allow(ctx, key, l)
			if err != nil || res.Allowed != allowed || res.Source != src {
				t.Fatalf("Allow(%s) = %+v, %v, want allowed %v from %v", key, res, err, allowed, src)
			}
		}
		opt := hybrid.Limit{Rate: 1e-3, Burst: 3, Mode: hybrid.Optimistic}
		allow("a", opt, true, hybrid.SourceLocal) // a new key's first request: on trust
		allow("a", opt, true, hybrid.SourceRedis) // its bucket learnt
		allow("a", opt, true, hybrid.SourceLocal) // the budget
		allow("a", opt, false, hybrid.SourceLocal)
		allow("a", opt, false, hybrid.SourceLocal)
		lease := hybrid.Limit{Rate: 1e-3, Burst: 10}
		allow("b", lease, true, hybrid.SourceRedis) // a cold key: fetched
		exact := hybrid.Limit{Rate: 1e-3, Burst: 1, Mode: hybrid.Exact}
		allow("e", exact, true, hybrid.SourceRedis)
		allow("e", exact, false, hybrid.SourceRedis)
		// Two rounds: the first, at a moment of its own within the first
		// interval, may come before "a" is due (its turn, 2 ms after its
		// last reply) and leave its charge to the second.
		settle(200 * time.Millisecond)

		// An outage: the cold key's fetch fails, the fallback admits it, and
		// the failing rounds open the breaker.
		ln.down.Store(true)
		allow("c", lease, true, hybrid.SourceFallback)
		settle(300 * time.Millisecond)
		if got := testutil.ToFloat64(metric(t, c, "hybrid_unsettled_tokens")); got != 1 {
			t.Errorf("in the outage: hybrid_unsettled_tokens = %v, want 1", got)
		}
		ln.down.Store(false)
		settle(2 * time.Second) // a probe closes the breaker; a round charges the outage
		shadow.Store(7)

		want := `
# HELP hybrid_breaker_state 1 for the circuit breaker's current state (closed, half-open, open), 0 for the others; on a Redis Cluster, the state of the node breaker furthest from closed.
# TYPE hybrid_breaker_state gauge
hybrid_breaker_state{limiter="api",state="closed"} 1
hybrid_breaker_state{limiter="api",state="half-open"} 0
hybrid_breaker_state{limiter="api",state="open"} 0
# HELP hybrid_breaker_transitions_total State changes of the circuit breaker around the Redis calls.
# TYPE hybrid_breaker_transitions_total counter
hybrid_breaker_transitions_total{from="closed",limiter="api",to="open"} 1
hybrid_breaker_transitions_total{from="half-open",limiter="api",to="closed"} 1
hybrid_breaker_transitions_total{from="half-open",limiter="api",to="open"} 0
hybrid_breaker_transitions_total{from="open",limiter="api",to="half-open"} 1
# HELP hybrid_decisions_total Decisions, by outcome (allowed, denied) and by where they came from: local (the key's allowance or the last view of Redis, no round trip), redis (a round trip for the request, Exact decisions included), fallback (the fallback policy, Redis unreachable). Allowed local decisions are added up at each settlement round.
# TYPE hybrid_decisions_total counter
hybrid_decisions_total{limiter="api",result="allowed",source="fallback"} 1
hybrid_decisions_total{limiter="api",result="allowed",source="local"} 2
hybrid_decisions_total{limiter="api",result="allowed",source="redis"} 3
hybrid_decisions_total{limiter="api",result="denied",source="fallback"} 0
hybrid_decisions_total{limiter="api",result="denied",source="local"} 2
hybrid_decisions_total{limiter="api",result="denied",source="redis"} 1
# HELP hybrid_degraded 1 while the fallback policy decides what needs Redis (a breaker is not closed; on a Redis Cluster, for the keys of that node), else 0.
# TYPE hybrid_degraded gauge
hybrid_degraded{limiter="api"} 0
# HELP hybrid_fallback_consumed_tokens_total Tokens admitted by the fallback policy, to be charged to Redis when it is back.
# TYPE hybrid_fallback_consumed_tokens_total counter
hybrid_fallback_consumed_tokens_total{limiter="api"} 1
# HELP hybrid_fetch_waits_total Requests that waited for a round trip to Redis: a cold key, or a lease that ran dry.
# TYPE hybrid_fetch_waits_total counter
hybrid_fetch_waits_total{limiter="api"} 3
# HELP hybrid_http_decisions_total Decisions of the HTTP middleware.
# TYPE hybrid_http_decisions_total counter
hybrid_http_decisions_total{limiter="api",outcome="denied"} 2
hybrid_http_decisions_total{limiter="api",outcome="shadow_denied"} 7
# HELP hybrid_instances The fleet size the fallback shares are computed with: Config.Instances, or the live count.
# TYPE hybrid_instances gauge
hybrid_instances{limiter="api"} 1
# HELP hybrid_live_instances Live instances as the last heartbeat counted them through Redis.
# TYPE hybrid_live_instances gauge
hybrid_live_instances{limiter="api"} 1
# HELP hybrid_redis_clock_skew_seconds Redis TIME minus this host's clock at the middle of the last round trip that carried it; positive when Redis is ahead. Accurate to within half the round trip.
# TYPE hybrid_redis_clock_skew_seconds gauge
hybrid_redis_clock_skew_seconds{limiter="api"} 2
# HELP hybrid_unsettled_tokens Consumption the last settlement round could not charge to Redis and keeps for a later one; it grows during an outage.
# TYPE hybrid_unsettled_tokens gauge
hybrid_unsettled_tokens{limiter="api"} 0
`
		names := []string{
			"hybrid_breaker_state", "hybrid_breaker_transitions_total", "hybrid_decisions_total",
			"hybrid_degraded", "hybrid_fallback_consumed_tokens_total", "hybrid_fetch_waits_total",
			"hybrid_http_decisions_total", "hybrid_instances", "hybrid_live_instances",
			"hybrid_redis_clock_skew_seconds", "hybrid_unsettled_tokens",
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
			t.Error(err)
		}

		// The histogram holds what the Stats hold: every round trip took no
		// time in the bubble, so all are in the first bucket.
		st := lim.Stats().Reconcile
		if st.RoundTrip.Count == 0 || st.RoundErrors == 0 {
			t.Fatalf("Stats: %d round trips timed, %d round errors, want some of each", st.RoundTrip.Count, st.RoundErrors)
		}
		var hist strings.Builder
		hist.WriteString("# HELP hybrid_settlement_round_trip_seconds Duration of the settlement calls of the rounds that Redis answered.\n")
		hist.WriteString("# TYPE hybrid_settlement_round_trip_seconds histogram\n")
		for _, b := range []string{"0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "+Inf"} {
			fmt.Fprintf(&hist, "hybrid_settlement_round_trip_seconds_bucket{limiter=\"api\",le=%q} %d\n", b, st.RoundTrip.Count)
		}
		fmt.Fprintf(&hist, "hybrid_settlement_round_trip_seconds_sum{limiter=\"api\"} 0\n")
		fmt.Fprintf(&hist, "hybrid_settlement_round_trip_seconds_count{limiter=\"api\"} %d\n", st.RoundTrip.Count)
		if err := testutil.CollectAndCompare(c, strings.NewReader(hist.String()), "hybrid_settlement_round_trip_seconds"); err != nil {
			t.Error(err)
		}
		for _, x := range []struct {
			name string
			want float64
		}{
			{"hybrid_settlement_rounds_total", float64(st.Rounds)},
			{"hybrid_settlement_round_errors_total", float64(st.RoundErrors)},
			{"hybrid_heartbeat_errors_total", float64(st.HeartbeatErrors)},
			{"hybrid_keys", 4},
			{"hybrid_redis_rtt_seconds", 0},
		} {
			if got := testutil.ToFloat64(metric(t, c, x.name)); got != x.want {
				t.Errorf("%s = %v, want %v", x.name, got, x.want)
			}
		}

		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
		reg := prometheus.NewPedanticRegistry()
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Gather(); err != nil {
			t.Errorf("Gather from a pedantic registry: %v", err)
		}
		if err := lim.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(metric(t, c, "hybrid_keys")); got != 0 {
			t.Errorf("after Close: hybrid_keys = %v, want 0", got)
		}
	})
}

// metric returns the part of c whose metrics are called name.
func metric(t *testing.T, c prometheus.Collector, name string) prometheus.Collector {
	t.Helper()
	return only{c, name}
}

// only is the part of a Collector whose metrics are called name.
type only struct {
	c    prometheus.Collector
	name string
}

func (o only) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(o, ch) }

func (o only) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() {
		o.c.Collect(all)
		close(all)
	}()
	for m := range all {
		if strings.Contains(m.Desc().String(), `fqName: "`+o.name+`"`) {
			ch <- m
		}
	}
}

// TestNewErrors: an Extra with an invalid name or label or no Read, and a
// nil source, are errors wrapping ErrConfig.
func TestNewErrors(t *testing.T) {
	read := func() map[string]uint64 { return nil }
	tests := []struct {
		name string
		src  hybridprom.Source
		x    hybridprom.Extra
	}{
		{"nil source", nil, hybridprom.Extra{Name: "x_total", Label: "l", Read: read}},
		{"bad name", stats{}, hybridprom.Extra{Name: "x-total", Label: "l", Read: read}},
		{"bad label", stats{}, hybridprom.Extra{Name: "x_total", Label: "a b", Read: read}},
		{"reserved label", stats{}, hybridprom.Extra{Name: "x_total", Label: "__l", Read: read}},
		{"empty label", stats{}, hybridprom.Extra{Name: "x_total", Read: read}},
		{"no Read", stats{}, hybridprom.Extra{Name: "x_total", Label: "l"}},
	}
	for _, tt := range tests {
		_, err := hybridprom.New(tt.src, hybridprom.Config{Extras: []hybridprom.Extra{tt.x}})
		if !errors.Is(err, hybridprom.ErrConfig) {
			t.Errorf("%s: New = %v, want ErrConfig", tt.name, err)
		}
	}
	if _, err := hybridprom.New(stats{}, hybridprom.Config{Extras: []hybridprom.Extra{{Name: "x_total", Label: "l", Read: read}}}); err != nil {
		t.Errorf("a valid Extra: New = %v", err)
	}
}

// stats is a Source with fixed Stats.
type stats struct{ s hybrid.Stats }

func (s stats) Stats() hybrid.Stats { return s.s }

// TestNodeBreakers: on a Redis Cluster each master's breaker is exported
// with its address; the breaker of a single Redis (address "") is not
// repeated there, and breaker_state shows the worst.
func TestNodeBreakers(t *testing.T) {
	var s hybrid.Stats
	s.Degraded = true
	s.Reconcile.Breaker = breaker.Open
	s.Reconcile.Nodes = []reconcile.NodeState{
		{Addr: "", Breaker: breaker.Closed},
		{Addr: "127.0.0.1:7000", Breaker: breaker.Closed},
		{Addr: "127.0.0.1:7001", Breaker: breaker.Open},
	}
	c, err := hybridprom.New(stats{s}, hybridprom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP hybrid_breaker_state 1 for the circuit breaker's current state (closed, half-open, open), 0 for the others; on a Redis Cluster, the state of the node breaker furthest from closed.
# TYPE hybrid_breaker_state gauge
hybrid_breaker_state{state="closed"} 0
hybrid_breaker_state{state="half-open"} 0
hybrid_breaker_state{state="open"} 1
# HELP hybrid_node_breaker_state On a Redis Cluster, 1 for the current state of the circuit breaker of each master the limiter has called, 0 for the others.
# TYPE hybrid_node_breaker_state gauge
hybrid_node_breaker_state{node="127.0.0.1:7000",state="closed"} 1
hybrid_node_breaker_state{node="127.0.0.1:7000",state="half-open"} 0
hybrid_node_breaker_state{node="127.0.0.1:7000",state="open"} 0
hybrid_node_breaker_state{node="127.0.0.1:7001",state="closed"} 0
hybrid_node_breaker_state{node="127.0.0.1:7001",state="half-open"} 0
hybrid_node_breaker_state{node="127.0.0.1:7001",state="open"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "hybrid_breaker_state", "hybrid_node_breaker_state"); err != nil {
		t.Error(err)
	}
}

// TestRefusals: the calls a node refused, by cause, are counters with the
// cause as label, every cause exported from the start; refusing shows the
// cause by which the open breaker's node refuses every call.
func TestRefusals(t *testing.T) {
	var s hybrid.Stats
	s.Degraded = true
	s.Reconcile.Breaker = breaker.Open
	s.Reconcile.Cause = global.Full
	s.Reconcile.Refusals[global.Full] = 7
	s.Reconcile.Refusals[global.Refused] = 2
	c, err := hybridprom.New(stats{s}, hybridprom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP hybrid_refused_calls_total Redis calls that failed because the node refuses every call alike, by cause: maxmemory (memory full, noeviction: OOM), readonly (a read-only replica: READONLY), masterdown (MASTERDOWN), misconf (RDB snapshots failing with stop-writes-on-bgsave-error: MISCONF), refused (the client refused: NOAUTH, WRONGPASS, NOPERM). Each counts as a failure for the node's breaker.
# TYPE hybrid_refused_calls_total counter
hybrid_refused_calls_total{cause="maxmemory"} 7
hybrid_refused_calls_total{cause="masterdown"} 0
hybrid_refused_calls_total{cause="misconf"} 0
hybrid_refused_calls_total{cause="readonly"} 0
hybrid_refused_calls_total{cause="refused"} 2
# HELP hybrid_refusing 1 for the cause by which a node whose breaker is not closed refuses every call (maxmemory, readonly, masterdown, misconf, refused), 0 for the others: all 0 while every breaker is closed or failed otherwise.
# TYPE hybrid_refusing gauge
hybrid_refusing{cause="maxmemory"} 1
hybrid_refusing{cause="masterdown"} 0
hybrid_refusing{cause="misconf"} 0
hybrid_refusing{cause="readonly"} 0
hybrid_refusing{cause="refused"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "hybrid_refused_calls_total", "hybrid_refusing"); err != nil {
		t.Error(err)
	}
}
