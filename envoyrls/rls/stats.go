package rls

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Hits is what one request did to the limit of one of its descriptors,
// counted as the original counts the stats it keeps under the descriptor's
// stats key (config.Match.StatsKey), in hits: a request of hits_addend h
// counts h. The fields are named after the original's stats.
type Hits struct {
	// Total is total_hits: the request's hits, whatever was decided.
	Total uint64
	// OverLimit is over_limit: the hits beyond the limit. Of a request
	// that found the limit already spent, all its hits; of one that crossed
	// it, those past it.
	OverLimit uint64
	// NearLimit is near_limit: the hits that fell between the near-limit
	// threshold (Config.NearLimitRatio of the limit, rounded down) and the
	// limit.
	NearLimit uint64
	// WithinLimit is within_limit: the hits of a request the limit did
	// not refuse.
	WithinLimit uint64
	// ShadowMode is shadow_mode: the hits a limit in shadow mode would
	// have refused (OverLimit counts them too).
	ShadowMode uint64
}

// Observer receives a Server's stats, as the original counts them, for a
// metrics system to keep (Counters keeps them in memory). Its methods are
// called on the request's goroutine with no lock held, and must be safe
// for concurrent use.
type Observer interface {
	// Hits is called once for each descriptor of a request that a limit
	// applied to (not an unlimited one, not one replaced, not one no
	// limit matched), with the descriptor's stats key.
	Hits(statsKey string, h Hits)
	// UnknownDomain is called once for each descriptor of a request for
	// a domain no file configures: the original's
	// "<domain>.domain_not_found".
	UnknownDomain(domain string)
}

// Counters is an Observer that keeps the counts in memory, by stats key
// and by domain. A stats key names a configured descriptor, but with
// detailed_metric or value_to_metric it holds the values requests send, so
// the keys may grow without bound, as the original's stats do. The zero
// Counters is ready to use; it is safe for concurrent use.
type Counters struct {
	keys    sync.Map // stats key -> *hitCounters
	domains sync.Map // domain -> *atomic.Uint64
}

// hitCounters are the counts of one stats key.
type hitCounters struct {
	total, over, near, within, shadow atomic.Uint64
}

// Hits adds h to the counts of statsKey.
func (c *Counters) Hits(statsKey string, h Hits) {
	v, ok := c.keys.Load(statsKey)
	if !ok {
		v, _ = c.keys.LoadOrStore(statsKey, new(hitCounters))
	}
	k := v.(*hitCounters)
	k.total.Add(h.Total)
	k.over.Add(h.OverLimit)
	k.near.Add(h.NearLimit)
	k.within.Add(h.WithinLimit)
	k.shadow.Add(h.ShadowMode)
}

// UnknownDomain counts a descriptor of a request for domain, which no file
// configures.
func (c *Counters) UnknownDomain(domain string) {
	v, ok := c.domains.Load(domain)
	if !ok {
		v, _ = c.domains.LoadOrStore(domain, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// Get returns the counts of statsKey: zero if it has none.
func (c *Counters) Get(statsKey string) Hits {
	v, ok := c.keys.Load(statsKey)
	if !ok {
		return Hits{}
	}
	return v.(*hitCounters).load()
}

// DomainNotFound returns how many descriptors came for domain while no file
// configured it.
func (c *Counters) DomainNotFound(domain string) uint64 {
	v, ok := c.domains.Load(domain)
	if !ok {
		return 0
	}
	return v.(*atomic.Uint64).Load()
}

// Range calls fn with every stats key and its counts, in no order, until
// fn returns false.
func (c *Counters) Range(fn func(statsKey string, h Hits) bool) {
	c.keys.Range(func(k, v any) bool {
		return fn(k.(string), v.(*hitCounters).load())
	})
}

// load returns a snapshot of k.
func (k *hitCounters) load() Hits {
	return Hits{
		Total:       k.total.Load(),
		OverLimit:   k.over.Load(),
		NearLimit:   k.near.Load(),
		WithinLimit: k.within.Load(),
		ShadowMode:  k.shadow.Load(),
	}
}

// Stats is a snapshot of a Server's own counters: its calls and their
// outcomes. The counts per descriptor go to Config.Observer.
type Stats struct {
	// Requests counts the calls answered with a response.
	Requests uint64
	// OverLimit counts the responses whose overall code is OVER_LIMIT.
	OverLimit uint64
	// GlobalShadowMode counts the responses that Config.ShadowMode made
	// OK: the original's "global_shadow_mode".
	GlobalShadowMode uint64
	// ServiceErrors counts the calls refused for the request itself, or
	// for want of a configuration (the original's
	// "call.should_rate_limit.service_error"): an empty domain, no
	// descriptor, no rules loaded, a limit override without a unit.
	ServiceErrors uint64
	// Unanswered counts the calls that ended without a decision: their
	// context ended first (the caller's deadline, a cancellation), or the
	// Limiter was closed. Redis's failures are never among them: the
	// Limiter's fallback answers for Redis.
	Unanswered uint64
}

// nShards is the number of counter shards: concurrent calls mostly update
// different cache lines.
const nShards = 16

// shard is one cache line of a Server's counters.
type shard struct {
	requests, overLimit, globalShadow, serviceErrors, unanswered atomic.Uint64
	_                                                            [128 - 5*8]byte
}

// shard returns a counter shard, picked at random.
func (s *Server) shard() *shard {
	return &s.counters[rand.Uint32()%nShards]
}

// Stats returns a snapshot of s's counters.
func (s *Server) Stats() Stats {
	var st Stats
	for i := range s.counters {
		c := &s.counters[i]
		st.Requests += c.requests.Load()
		st.OverLimit += c.overLimit.Load()
		st.GlobalShadowMode += c.globalShadow.Load()
		st.ServiceErrors += c.serviceErrors.Load()
		st.Unanswered += c.unanswered.Load()
	}
	return st
}
