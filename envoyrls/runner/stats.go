package runner

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// descStats is the rls.Observer of a Service: it counts the hits of every
// descriptor under the Prometheus labels that the original's default
// statsd-to-Prometheus mapping gives its stat
// ratelimit.service.rate_limit.<stats key>.<stat>: the stats key, with
// ':' and '|' and the dots of IPv4 addresses made underscores as the
// original makes them, split at its dots into domain, key1 and key2 (the
// first three parts; deeper levels count with their first two, as there).
//
// The label sets are bounded by max: the stats keys come from the
// configuration, but detailed_metric and value_to_metric put the values
// requests send in them. The hits of a label set past the bound are
// counted under the empty one (an empty domain: a request's domain is
// never empty). domain_not_found is bounded alike, by domain. The request
// path takes no lock: a stats key seen before is one sync.Map read.
type descStats struct {
	max int64

	byKey    sync.Map     // stats key -> *series, at most 4*max
	keys     atomic.Int64 // entries of byKey
	byLabels sync.Map     // labels -> *series, at most max
	series   atomic.Int64 // entries of byLabels
	overflow series

	domains        sync.Map // sanitized domain -> *atomic.Uint64, at most max
	nDomains       atomic.Int64
	domainOverflow atomic.Uint64
}

// labels are the labels of a series.
type labels struct{ domain, key1, key2 string }

// series are the counts of one label set, named after the original's
// stats.
type series struct {
	labels                            labels
	total, over, near, within, shadow atomic.Uint64
}

// newDescStats returns a descStats of at most max label sets.
func newDescStats(max int) *descStats {
	return &descStats{max: int64(max)}
}

// Hits counts h under statsKey's labels.
func (d *descStats) Hits(statsKey string, h rls.Hits) {
	s := d.find(statsKey)
	s.total.Add(h.Total)
	s.over.Add(h.OverLimit)
	s.near.Add(h.NearLimit)
	s.within.Add(h.WithinLimit)
	s.shadow.Add(h.ShadowMode)
}

// find returns the series of statsKey.
func (d *descStats) find(statsKey string) *series {
	if v, ok := d.byKey.Load(statsKey); ok {
		return v.(*series)
	}
	s := d.ofLabels(labelsOf(statsKey))
	if d.keys.Add(1) > 4*d.max {
		// Too many stats keys to remember: their labels are worked out
		// each time.
		d.keys.Add(-1)
		return s
	}
	v, loaded := d.byKey.LoadOrStore(statsKey, s)
	if loaded {
		d.keys.Add(-1)
	}
	return v.(*series)
}

// ofLabels returns the series of l, or the overflow series if there are
// max already.
func (d *descStats) ofLabels(l labels) *series {
	if v, ok := d.byLabels.Load(l); ok {
		return v.(*series)
	}
	if d.series.Add(1) > d.max {
		d.series.Add(-1)
		return &d.overflow
	}
	v, loaded := d.byLabels.LoadOrStore(l, &series{labels: l})
	if loaded {
		d.series.Add(-1)
	}
	return v.(*series)
}

// UnknownDomain counts a descriptor of domain, which no file configures.
func (d *descStats) UnknownDomain(domain string) {
	d.domainCounter(sanitize(domain)).Add(1)
}

// domainCounter returns the domain_not_found counter of domain.
func (d *descStats) domainCounter(domain string) *atomic.Uint64 {
	if v, ok := d.domains.Load(domain); ok {
		return v.(*atomic.Uint64)
	}
	if d.nDomains.Add(1) > d.max {
		d.nDomains.Add(-1)
		return &d.domainOverflow
	}
	v, loaded := d.domains.LoadOrStore(domain, new(atomic.Uint64))
	if loaded {
		d.nDomains.Add(-1)
	}
	return v.(*atomic.Uint64)
}

// eachSeries calls fn with every series that has counts, the overflow
// series included.
func (d *descStats) eachSeries(fn func(*series)) {
	d.byLabels.Range(func(_, v any) bool {
		fn(v.(*series))
		return true
	})
	if d.overflow.total.Load() > 0 {
		fn(&d.overflow)
	}
}

// eachDomain calls fn with every domain_not_found count, the overflow's
// under "".
func (d *descStats) eachDomain(fn func(domain string, n uint64)) {
	d.domains.Range(func(k, v any) bool {
		fn(k.(string), v.(*atomic.Uint64).Load())
		return true
	})
	if n := d.domainOverflow.Load(); n > 0 {
		fn("", n)
	}
}

// labelsOf returns the labels of a stats key.
func labelsOf(statsKey string) labels {
	parts := strings.SplitN(sanitize(statsKey), ".", 4)
	var l labels
	l.domain = parts[0]
	if len(parts) > 1 {
		l.key1 = parts[1]
	}
	if len(parts) > 2 {
		l.key2 = parts[2]
	}
	return l
}

// ipv4 matches what the original takes for an IPv4 address in a stat name.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitize makes a stats key a stat name as the original does: ':' and
// '|' become '_', and so do the dots of IPv4 addresses, so that they do
// not split the name.
func sanitize(s string) string {
	if strings.ContainsAny(s, ":|") {
		s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	}
	if !ipv4.MatchString(s) {
		return s
	}
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string {
		return strings.ReplaceAll(ip, ".", "_")
	})
}
