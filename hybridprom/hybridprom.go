// Package hybridprom exports the statistics of a hybrid.Limiter as Prometheus
// metrics, in its own package so that the limiter itself does not depend on
// the Prometheus client.
//
// A Collector reads Limiter.Stats when it is scraped: it starts no goroutine
// and keeps no state of its own. Every metric name starts with "hybrid_";
// counters are counters, states and levels are gauges. docs/observability.md
// lists them with what to alert on.
//
//	c, err := hybridprom.New(lim, hybridprom.Config{})
//	if err != nil { ... }
//	prometheus.MustRegister(c)
package hybridprom

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Namespace starts the name of every metric of a Collector.
const Namespace = "hybrid"

// Source is what a Collector reads. *hybrid.Limiter implements it.
type Source interface {
	Stats() hybrid.Stats
}

// Extra is a set of counters kept outside the Limiter, such as an HTTP
// middleware's (shadow denials, say), exported by the Collector with the
// Limiter's as one counter metric named Namespace_Name with one series per
// key of what Read returns, the key in the label Label. Read is called at
// every scrape, from the scraping goroutine; it must be safe for concurrent
// use, and its counts must never go down.
type Extra struct {
	// Name follows "hybrid_": "http_decisions_total", say.
	Name string
	// Help describes the metric.
	Help string
	// Label names the label that tells the counters apart: "outcome", say.
	Label string
	// Read returns the counters, by label value.
	Read func() map[string]uint64
}

// Config configures a Collector. The zero Config is ready to use.
type Config struct {
	// ConstLabels are added to every metric: {"limiter": "api"}, say, to
	// tell the metrics of several Limiters in one process apart (each then
	// needs its own Collector).
	ConstLabels prometheus.Labels
	// Extras are further counters to export with the Limiter's.
	Extras []Extra
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("hybridprom: invalid config")

// Collector is a prometheus.Collector of a Limiter's statistics. It is safe
// for concurrent use. Create one with New.
type Collector struct {
	src    Source
	d      descs
	extras []extra
}

// extra is an Extra with its description.
type extra struct {
	desc *prometheus.Desc
	read func() map[string]uint64
}

// descs describes the metrics of a Collector.
type descs struct {
	decisions, fetchWaits, unanswered, refunds, exactErrors, fallbackConsumed *prometheus.Desc

	rounds, roundErrors, roundTrip, roundTripMax         *prometheus.Desc
	keysSettled, keyErrors, uncertain, resets            *prometheus.Desc
	duplicates, doubtsExpired, resent                    *prometheus.Desc
	fetches, fetchErrors, fetchTimeouts, heartbeatErrors *prometheus.Desc
	batches, batched, pressured, losses, recharged       *prometheus.Desc
	tails, credited                                      *prometheus.Desc
	forgiven, window, pathRTT, hurried, queueWait        *prometheus.Desc
	batchTrip                                            *prometheus.Desc
	transitions, breakerState, nodeState, degraded       *prometheus.Desc
	refusals, refusing                                   *prometheus.Desc
	evictions, evictionsWithDues, orphans, keys          *prometheus.Desc
	inFlight                                             *prometheus.Desc
	ledgerKeys, ledgerBytes, ledgerUnknown, crowded      *prometheus.Desc
	unsettled, instances, live, skew, rtt                *prometheus.Desc
}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// New returns a Collector of src's statistics: a *hybrid.Limiter, usually.
// It reports an error wrapping ErrConfig for an Extra with an invalid name or
// label, or without Read.
func New(src Source, cfg Config) (*Collector, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: nil source", ErrConfig)
	}
	c := &Collector{src: src}
	cl := cfg.ConstLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(Namespace+"_"+name, help, labels, cl)
	}
	c.d = descs{
		decisions:        desc("decisions_total", "Decisions, by outcome (allowed, denied) and by where they came from: local (the key's allowance or the last view of Redis, no round trip), redis (a round trip for the request, Exact decisions included), fallback (the fallback policy, Redis unreachable). Allowed local decisions are added up at each settlement round.", "source", "result"),
		fetchWaits:       desc("fetch_waits_total", "Requests that waited for a round trip to Redis: a cold key, or a lease that ran dry."),
		unanswered:       desc("unanswered_total", "Requests denied because Redis did not answer them in time while its breaker was closed: a slow or busy Redis, not an outage. They count among the denied decisions from redis."),
		refunds:          desc("refunds_total", "Cancelled reservations, whose tokens were given back."),
		exactErrors:      desc("exact_errors_total", "Exact decisions whose script call failed; the fallback policy decided them."),
		fallbackConsumed: desc("fallback_consumed_tokens_total", "Tokens admitted by the fallback policy, to be charged to Redis when it is back."),
		ledgerKeys:       desc("fallback_ledger_keys", "Keys whose entries left the store with a fallback share not full yet, as the ledger remembers them (at most twice MaxKeys, at least 65,536)."),
		ledgerBytes:      desc("fallback_ledger_bytes", "Memory of the ledger of evicted keys' fallback shares: 0 until the first entry leaves the store with a share not full."),
		ledgerUnknown:    desc("fallback_ledger_unknown_total", "Reads of the ledger for a key it held no record of while its set had dropped records still in the future: the fallback started that key's share from the least a dropped one might hold."),
		crowded:          desc("fallback_crowded_total", "Fallback denials of keys that owed Redis nothing yet while the instance owed it for as many evicted keys as its ledger holds: a flood of distinct keys during an outage, denied rather than remembered without bound."),
		rounds:           desc("settlement_rounds_total", "Settlement rounds that had something to settle."),
		roundErrors:      desc("settlement_round_errors_total", "Settlement rounds whose round trip failed or was refused by the open breaker; their consumption is kept for a later round."),
		roundTrip:        desc("settlement_round_trip_seconds", "Duration of the settlement calls of the rounds that Redis answered."),
		roundTripMax:     desc("settlement_round_trip_max_seconds", "The longest settlement call Redis answered since the Limiter started."),
		keysSettled:      desc("settled_keys_total", "Keys settled with Redis, in rounds and fetches."),
		batches:          desc("batches_total", "Round trips that carried the settlements requests needed at once (fetches, takes, exact decisions)."),
		pressured:        desc("pressured_calls_total", "Redis calls that timed out while Redis answered others: a busy Redis, not counted as failures by the circuit breakers."),
		losses:           desc("redis_losses_total", "Heartbeats that found Redis had lost this instance's writes (a failover to a replica that lagged, a restart)."),
		tails:            desc("redis_outage_tails_total", "Failovers seen after an outage, another server answering with this instance's last beat kept (a replica promoted in a dead master's place): what this instance's settlements took in their last moments before the outage was charged again."),
		recharged:        desc("recharged_tokens_total", "Tokens charged again after Redis lost this instance's writes: what its settlements had taken since."),
		forgiven:         desc("forgiven_tokens_total", "Tokens of consumption not charged, their buckets owing the debt's bound already (Config.MaxDebt): what the fleet may have admitted beyond the limit."),
		credited:         desc("outage_credited_tokens_total", "Tokens of an outage's fallback admissions not charged when Redis was back, claimed out of the refill their buckets lost at the burst meanwhile (Config.ShareCredit)."),
		batched:          desc("batched_settlements_total", "Settlements those round trips carried."),
		batchTrip:        desc("batch_round_trip_seconds", "Duration of the round trips of the batches of settlements that requests needed at once (fetches, takes, exact decisions) that Redis answered."),
		queueWait:        desc("batch_queue_wait_seconds", "How long the settlements that found their Redis node's batch window full waited for a batch on its way to come back before theirs could leave: what a cold decision took beyond its own round trip. Its count is the settlements that waited."),
		hurried:          desc("hurried_settlements_total", "Settlements a round sent before their turn, in its next call, as requests waited for their keys."),
		window:           desc("batch_window", "How many batches of requests (fetches, takes, exact decisions) may be on their way to a Redis node at once: it opens while the network is most of a round trip, and stays at 1 (2 for an instance alone) while Redis's work is. The node label is empty for a single Redis.", "node"),
		pathRTT:          desc("batch_path_rtt_seconds", "The least round trip of a Redis node's batches of late (the last 10 to 20 seconds): the network and a call's fixed costs, which the batch window is sized against.", "node"),
		keyErrors:        desc("settle_key_errors_total", "Key settlements that failed; what they carried was kept for a later round."),
		uncertain:        desc("uncertain_settlements_total", "Settlements that got no reply, so may have been applied: each is sent again until a reply tells."),
		duplicates:       desc("duplicate_settlements_total", "Settlements sent again that Redis had applied already: charges not made twice."),
		resent:           desc("resent_calls_total", "Calls for a request sent again because their connection broke under them."),
		doubtsExpired:    desc("expired_doubts_total", "Settlements still in doubt after 5 minutes, given up: consumption charged anew, give-back dropped."),
		resets:           desc("bucket_resets_total", "Buckets Redis held unreadable (another type, garbled fields), replaced by full ones."),
		fetches:          desc("fetches_total", "Round trips made for requests that waited (shared by concurrent requests for a key)."),
		fetchErrors:      desc("fetch_errors_total", "Fetches that failed."),
		fetchTimeouts:    desc("fetch_timeouts_total", "Requests that stopped waiting for a fetch after ColdWait."),
		heartbeatErrors:  desc("heartbeat_errors_total", "Heartbeats that failed."),
		transitions:      desc("breaker_transitions_total", "State changes of the circuit breaker around the Redis calls.", "from", "to"),
		breakerState:     desc("breaker_state", "1 for the circuit breaker's current state (closed, half-open, open), 0 for the others; on a Redis Cluster, the state of the node breaker furthest from closed.", "state"),
		nodeState:        desc("node_breaker_state", "On a Redis Cluster, 1 for the current state of the circuit breaker of each master the limiter has called, 0 for the others.", "node", "state"),
		degraded:         desc("degraded", "1 while the fallback policy decides what needs Redis (a breaker is not closed; on a Redis Cluster, for the keys of that node), else 0."),
		refusals:         desc("refused_calls_total", "Redis calls that failed because the node refuses every call alike, by cause: maxmemory (memory full, noeviction: OOM), readonly (a read-only replica: READONLY), masterdown (MASTERDOWN), misconf (RDB snapshots failing with stop-writes-on-bgsave-error: MISCONF), refused (the client refused: NOAUTH, WRONGPASS, NOPERM). Each counts as a failure for the node's breaker.", "cause"),
		refusing:         desc("refusing", "1 for the cause by which a node whose breaker is not closed refuses every call (maxmemory, readonly, masterdown, misconf, refused), 0 for the others: all 0 while every breaker is closed or failed otherwise.", "cause"),
		evictions:        desc("evictions_total", "Keys that left the in-memory store (evicted, or drained by Close)."),
		evictionsWithDues: desc("evictions_with_dues_total",
			"Keys that left the store with consumption to charge or a lease to give back: they were settled as orphans."),
		orphans:   desc("orphans", "Keys that left the store with dues, waiting for the next round."),
		inFlight:  desc("settlements_in_flight", "Settlements of the round under way not answered yet."),
		keys:      desc("keys", "Keys tracked in memory."),
		unsettled: desc("unsettled_tokens", "Consumption the last settlement round could not charge to Redis and keeps for a later one; it grows during an outage."),
		instances: desc("instances", "The fleet size the fallback shares are computed with: Config.Instances, or the live count."),
		live:      desc("live_instances", "Live instances as the last heartbeat counted them through Redis."),
		skew:      desc("redis_clock_skew_seconds", "Redis TIME minus this host's clock at the middle of the last round trip that carried it; positive when Redis is ahead. Accurate to within half the round trip."),
		rtt:       desc("redis_rtt_seconds", "Duration of the last round trip that carried Redis TIME (a settlement call or a heartbeat)."),
	}
	for _, x := range cfg.Extras {
		switch {
		case !metricName.MatchString(Namespace + "_" + x.Name):
			return nil, fmt.Errorf("%w: extra metric name %q", ErrConfig, x.Name)
		case !labelName.MatchString(x.Label) || len(x.Label) >= 2 && x.Label[:2] == "__":
			return nil, fmt.Errorf("%w: extra %q: label name %q", ErrConfig, x.Name, x.Label)
		case x.Read == nil:
			return nil, fmt.Errorf("%w: extra %q: nil Read", ErrConfig, x.Name)
		}
		c.extras = append(c.extras, extra{desc: desc(x.Name, x.Help, x.Label), read: x.Read})
	}
	return c, nil
}

// Describe sends the descriptions of every metric of c to ch.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	d := &c.d
	for _, x := range []*prometheus.Desc{
		d.decisions, d.fetchWaits, d.unanswered, d.refunds, d.exactErrors, d.fallbackConsumed,
		d.rounds, d.roundErrors, d.roundTrip, d.roundTripMax,
		d.keysSettled, d.keyErrors, d.uncertain, d.resets, d.duplicates, d.doubtsExpired, d.resent,
		d.fetches, d.fetchErrors, d.fetchTimeouts, d.heartbeatErrors, d.batches, d.batched, d.pressured, d.losses, d.tails, d.recharged,
		d.forgiven, d.credited, d.window, d.pathRTT, d.hurried, d.queueWait, d.batchTrip, d.transitions, d.breakerState, d.nodeState, d.degraded, d.refusals, d.refusing,
		d.evictions, d.evictionsWithDues, d.orphans, d.keys, d.inFlight,
		d.ledgerKeys, d.ledgerBytes, d.ledgerUnknown, d.crowded,
		d.unsettled, d.instances, d.live, d.skew, d.rtt,
	} {
		ch <- x
	}
	for _, x := range c.extras {
		ch <- x.desc
	}
}

// sources are the sources of decisions, in label order.
var sources = [...]hybrid.Source{hybrid.SourceLocal, hybrid.SourceRedis, hybrid.SourceFallback}

// transitions are the state changes a breaker makes.
var transitions = [...][2]breaker.State{
	{breaker.Closed, breaker.Open},
	{breaker.Open, breaker.HalfOpen},
	{breaker.HalfOpen, breaker.Open},
	{breaker.HalfOpen, breaker.Closed},
}

// Collect reads the Limiter's statistics once and sends them to ch as
// metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	r := &s.Reconcile
	d := &c.d
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	for _, src := range sources {
		counter(d.decisions, s.Allowed(src), src.String(), "allowed")
		counter(d.decisions, s.Denied(src), src.String(), "denied")
	}
	counter(d.fetchWaits, s.Fetched)
	counter(d.unanswered, s.Unanswered)
	counter(d.refunds, s.Refunds)
	counter(d.exactErrors, s.ExactErrors)
	ch <- prometheus.MustNewConstMetric(d.fallbackConsumed, prometheus.CounterValue, tokens(int64(s.FallbackConsumed)))
	gauge(d.ledgerKeys, float64(s.Ledger.Keys))
	gauge(d.ledgerBytes, float64(s.Ledger.Bytes))
	counter(d.ledgerUnknown, s.Ledger.Unknown)
	counter(d.crowded, s.FallbackCrowded)

	counter(d.rounds, r.Rounds)
	counter(d.roundErrors, r.RoundErrors)
	ch <- roundTrip(d.roundTrip, &r.RoundTrip)
	gauge(d.roundTripMax, r.RoundTrip.Max.Seconds())
	counter(d.keysSettled, r.KeysSettled)
	counter(d.batches, r.Batches)
	counter(d.pressured, r.Pressured)
	counter(d.losses, r.Losses)
	counter(d.tails, r.Tails)
	ch <- prometheus.MustNewConstMetric(d.recharged, prometheus.CounterValue, float64(r.Recharged)/1e6)
	ch <- prometheus.MustNewConstMetric(d.forgiven, prometheus.CounterValue, float64(r.Forgiven)/1e6)
	ch <- prometheus.MustNewConstMetric(d.credited, prometheus.CounterValue, float64(r.Credited)/1e6)
	counter(d.batched, r.Batched)
	ch <- roundTrip(d.queueWait, &r.QueueWait)
	ch <- roundTrip(d.batchTrip, &r.BatchTrip)
	counter(d.hurried, r.Hurried)
	counter(d.keyErrors, r.KeyErrors)
	counter(d.uncertain, r.Uncertain)
	counter(d.duplicates, r.Duplicates)
	counter(d.resent, r.Resent)
	counter(d.doubtsExpired, r.DoubtsExpired)
	counter(d.resets, r.Resets+s.ExactResets)
	counter(d.fetches, r.Fetches)
	counter(d.fetchErrors, r.FetchErrors)
	counter(d.fetchTimeouts, r.FetchTimeouts)
	counter(d.heartbeatErrors, r.HeartbeatErrors)

	bt := &r.BreakerTransitions
	for from := range bt {
		for to := range bt[from] {
			if n := bt[from][to]; n > 0 || isTransition(from, to) {
				counter(d.transitions, n, breaker.State(from).String(), breaker.State(to).String())
			}
		}
	}
	states := [...]breaker.State{breaker.Closed, breaker.HalfOpen, breaker.Open}
	for _, st := range states {
		gauge(d.breakerState, flag(r.Breaker == st), st.String())
	}
	for _, n := range r.Nodes {
		if n.Window > 0 {
			gauge(d.window, float64(n.Window), n.Addr)
			gauge(d.pathRTT, n.PathRTT.Seconds(), n.Addr)
		}
		if n.Addr == "" {
			continue // the breaker of a single Redis: breaker_state
		}
		for _, st := range states {
			gauge(d.nodeState, flag(n.Breaker == st), n.Addr, st.String())
		}
	}
	gauge(d.degraded, flag(s.Degraded))
	for c := global.Cause(1); int(c) < global.Causes; c++ {
		counter(d.refusals, r.Refusals[c], c.String())
		gauge(d.refusing, flag(r.Cause == c), c.String())
	}

	counter(d.evictions, r.Evicted)
	counter(d.evictionsWithDues, r.EvictedPending)
	gauge(d.orphans, float64(r.Orphans))
	gauge(d.inFlight, float64(r.InFlight))
	gauge(d.keys, float64(r.Keys))
	gauge(d.unsettled, tokens(r.Unsettled))
	gauge(d.instances, float64(r.Instances))
	if r.Live > 0 {
		gauge(d.live, float64(r.Live))
	}
	if r.ClockSamples > 0 {
		gauge(d.skew, r.Skew.Seconds())
		gauge(d.rtt, r.RTT.Seconds())
	}

	for _, x := range c.extras {
		for k, v := range x.read() {
			counter(x.desc, v, k)
		}
	}
}

// isTransition reports whether a breaker can go from one state to the
// other: those transitions are exported even while they have not happened.
func isTransition(from, to int) bool {
	for _, t := range transitions {
		if int(t[0]) == from && int(t[1]) == to {
			return true
		}
	}
	return false
}

// roundTrip returns h as a Prometheus histogram, in seconds.
func roundTrip(desc *prometheus.Desc, h *reconcile.Histogram) prometheus.Metric {
	bounds := h.Bounds()
	buckets := make(map[float64]uint64, len(bounds))
	var n uint64
	for i, b := range bounds {
		n += h.Counts[i]
		buckets[b.Seconds()] = n
	}
	n += h.Counts[len(bounds)] // above every bound: in the count only
	return prometheus.MustNewConstHistogram(desc, n, h.Sum.Seconds(), buckets)
}

// tokens converts micro-tokens to tokens.
func tokens(micro int64) float64 { return float64(micro) / local.Micro }

// flag returns 1 for true and 0 for false.
func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
