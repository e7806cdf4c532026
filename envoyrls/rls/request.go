package rls

import (
	"sync"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// request is a RateLimitRequest as planned: one item per descriptor, the
// matches they found (with the zero Match for a descriptor that found
// none), and the entries the matches refer to. Requests are kept in a pool
// for the next ones (getRequest, release): the common request, of a few
// descriptors, makes no allocation of its own for them.
type request struct {
	items   []item
	matches []config.Match
	entries []config.Entry

	ibuf [4]item
	mbuf [4]config.Match
	ebuf [8]config.Entry
}

// requests are the requests not in use.
var requests = sync.Pool{New: func() any { return new(request) }}

// getRequest returns an empty request from the pool.
func getRequest() *request {
	r := requests.Get().(*request)
	r.items, r.matches, r.entries = r.ibuf[:0], r.mbuf[:0], r.ebuf[:0]
	return r
}

// release empties r, so that it keeps nothing of the call alive, and puts
// it back in the pool.
func (r *request) release() {
	clear(r.ibuf[:])
	clear(r.mbuf[:])
	clear(r.ebuf[:])
	r.items, r.matches, r.entries = nil, nil, nil
	requests.Put(r)
}

// kind is what applies to a descriptor.
type kind uint8

const (
	// noLimit: no descriptor matched, the domain is unknown, or its limit
	// was replaced. OK, with no current_limit, as the original answers.
	noLimit kind = iota
	// unlimited: an unlimited rate_limit. OK, with limit_remaining the
	// largest uint32 and no current_limit, as the original answers, and
	// the Limiter is not asked.
	unlimited
	// limited: a limit the Limiter decides.
	limited
)

// item is one descriptor of a request: what applies to it and, once
// decided, the outcome.
type item struct {
	kind kind
	m    *config.Match // the match, for unlimited and limited
	// entries are the descriptor's entries, keys and values as sent.
	entries []config.Entry
	b       bucket // limited: the bucket; b.n is 0 for requests_per_unit 0
	key     string // limited, b.n > 0: the bucket key
	// hits is the request's hits for this descriptor: its own hits_addend
	// if it has one (0 is a check that takes nothing, as in the original),
	// else the request's, 0 meaning 1.
	hits   uint64
	shadow bool // shadow_mode
	quota  bool // quota_mode, or Config.QuotaMode
	refund bool // is_negative_hits: takes nothing (see the package doc)

	// The outcome, in requests (hits).
	over      bool          // the limit refused the request
	before    int64         // what the bucket held before the request, as known here
	remaining int64         // what it holds after it
	reset     time.Duration // until it is full again
}

// plan fills r from req on rules: it looks up every descriptor, drops the
// limits that others replace, and gives each limit its bucket and key.
// Its error is a status for a descriptor it cannot serve.
func (s *Server) plan(r *request, rules *config.Rules, req *rlspb.RateLimitRequest) error {
	descs := req.GetDescriptors()
	domain := req.GetDomain()
	total := 0
	for _, d := range descs {
		total += len(d.GetEntries())
	}
	if cap(r.entries) < total {
		r.entries = make([]config.Entry, 0, total) // never grown below: matches refer to it
	}
	r.items = grow(r.items, len(descs))
	r.matches = grow(r.matches, len(descs))
	known := rules.HasDomain(domain)
	hits := uint64(max(1, req.GetHitsAddend()))
	for i, d := range descs {
		start := len(r.entries)
		for _, e := range d.GetEntries() {
			r.entries = append(r.entries, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries := r.entries[start:len(r.entries):len(r.entries)]
		it := &r.items[i]
		*it = item{entries: entries, hits: hits, refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			it.hits = h.GetValue()
		}
		if !known {
			if s.obs != nil {
				s.obs.UnknownDomain(domain)
			}
			continue
		}
		var (
			m  config.Match
			ok bool
		)
		if o := d.GetLimit(); o != nil {
			unit := config.Unit(o.GetUnit())
			if unit.Duration() == 0 {
				return status.Errorf(codes.InvalidArgument, msgOverrideNoUnit, i)
			}
			m, ok = rules.Override(domain, entries, o.GetRequestsPerUnit(), unit)
		} else {
			m, ok = rules.Lookup(domain, entries)
		}
		r.matches[i] = m
		if !ok {
			continue
		}
		it.m = &r.matches[i]
		it.kind = limited
		if m.Limit.Unlimited {
			it.kind = unlimited
		}
	}
	var shared [8]string
	for i := range r.items {
		it := &r.items[i]
		if it.kind != limited {
			continue
		}
		m := it.m
		if m.ReplacedBy(r.matches) {
			it.kind, it.m = noLimit, nil
			continue
		}
		it.shadow = m.ShadowMode
		it.quota = s.quota || m.QuotaMode
		if m.Limit.RequestsPerUnit == 0 {
			continue // refuses every request, with no bucket
		}
		it.b = bucketOf(m.Limit.RequestsPerUnit, m.Limit.Unit, modeOf(m.Limit.Mode, s.mode))
		var kb [maxPlainKey + 64]byte
		it.key = string(appendKey(kb[:0], domain, m.Limit.Unit, it.entries, m.SharedPatterns(shared[:0])))
	}
	return nil
}

// grow returns s with length n, reusing its array if it is large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
