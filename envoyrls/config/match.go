package config

import "bytes"

// Entry is one key/value pair of a request's descriptor, as Envoy sends it
// (envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry).
type Entry struct {
	Key, Value string
}

// Match is the limit that applies to a request's descriptor, found by
// Lookup or made by Override. Its exported fields are copies; Replaces
// and Metadata are shared with the Rules and must not be modified.
//
// A Match refers to the entries it was found for, to build its stats key
// when that depends on their values: they must not change while the Match
// is in use. The zero Match is no match.
type Match struct {
	// Domain is the domain of the request.
	Domain string
	// Path is the descriptor path of the descriptor that matched, such as
	// "key1_value1.subkey1": composite keys as configured, so "wild_foo*"
	// for a wildcard. It is "" for an Override.
	Path string
	// Limit is the descriptor's rate_limit.
	Limit Limit
	// ShadowMode is the descriptor's shadow_mode: the request is counted
	// and reported, but always allowed.
	ShadowMode bool
	// QuotaMode is the descriptor's quota_mode: the original lets a
	// request through until all of its quota-mode descriptors are over
	// their limits.
	QuotaMode bool
	// DetailedMetric is the descriptor's detailed_metric; StatsKey already
	// takes it into account.
	DetailedMetric bool
	// Metadata is the descriptor's metadata, nil if it has none. Its
	// values are nil, bool, int, int64, uint64, float64, string,
	// map[string]any and []any, every string valid UTF-8, so that
	// structpb.NewStruct accepts it.
	Metadata map[string]any

	dom      *domain
	leaf     *node // nil for an Override
	entries  []Entry
	mode     keyMode
	static   bool // the stats key is leaf.fullKey
	shared   bool // some entry shares a threshold
	override bool
}

// kind is how an entry matched a descriptor.
type kind uint8

const (
	byValue    kind = iota + 1 // the composite key key_value
	byWildcard                 // a composite key with a '*'
	byKey                      // the key alone
)

// keyMode is how the stats key is built; see segment.
type keyMode uint8

const (
	modePlain    keyMode = iota // no detailed_metric on the matched descriptor
	modeDetailed                // detailed_metric, no shared threshold
	modeShared                  // detailed_metric, some shared threshold
)

// bufSize is the size of the buffer Lookup builds composite keys in on its
// stack. A longer key and value still work, with an allocation.
const bufSize = 256

// Lookup finds the limit of a request's descriptor in domain, as the
// original's GetLimit does:
//
//   - the entries are matched level by level: the first against the
//     domain's descriptors, the next against the nested descriptors of the
//     one it matched, and so on;
//   - at each level the descriptor with the composite key "key_value" wins
//     (a value match), then the first descriptor, in file order, whose
//     composite key with wildcards matches "key_value" (each '*' matches
//     any run of bytes, "" too), then the descriptor with the key alone;
//   - only the rate_limit of the last entry's descriptor counts, none above
//     it, and the match must get there: a request with more entries than
//     the levels of the tree matches nothing, even where a descriptor on
//     its way has a rate_limit.
//
// ok is false if the domain is not configured, if the entries are empty,
// if they match no descriptor, or if the descriptor of the last entry has
// no rate_limit: such a descriptor, like a missing one, limits nothing. An
// unlimited rate_limit is a Match with Limit.Unlimited set.
//
// Lookup does not allocate unless an entry's key and value are longer
// than 255 bytes together; the Match refers to entries (see Match).
func (r *Rules) Lookup(domain string, entries []Entry) (m Match, ok bool) {
	d := r.domains[domain]
	if d == nil || len(entries) == 0 {
		return Match{}, false
	}
	var arr [bufSize]byte
	buf := arr[:0]
	cur := &d.root
	eq := [3]bool{true, true, true} // whether each mode's key is still fullKey
	shared := false
	for i, e := range entries {
		var next *node
		var k kind
		next, k, buf = cur.step(e, buf)
		if next == nil {
			return Match{}, false
		}
		if _, ok := sharePattern(e, next, k); ok {
			shared = true
		}
		for mode := range eq {
			if eq[mode] {
				val, sep := segment(keyMode(mode), e, next, k)
				eq[mode] = segmentIs(next.composite, e.Key, sep, val)
			}
		}
		if i == len(entries)-1 {
			if next.limit == nil {
				return Match{}, false
			}
			mode := modePlain
			if next.detailedMetric {
				mode = modeDetailed
				if shared {
					mode = modeShared
				}
			}
			return Match{
				Domain:         domain,
				Path:           next.path(),
				Limit:          *next.limit,
				ShadowMode:     next.shadowMode,
				QuotaMode:      next.quotaMode,
				DetailedMetric: next.detailedMetric,
				Metadata:       next.metadata,
				dom:            d,
				leaf:           next,
				entries:        entries,
				mode:           mode,
				static:         eq[mode],
				shared:         shared,
			}, true
		}
		if len(next.children) == 0 {
			return Match{}, false
		}
		cur = next
	}
	return Match{}, false // not reached: the last entry returns
}

// Override returns the limit a request's descriptor sets for itself (its
// limit field: requests per unit and unit), as the original's GetLimit
// does: it applies to any descriptor of a configured domain, whether the
// entries match a descriptor or not, without shadow mode, name or
// replaces. Its StatsKey is the domain and the entries, each "key_value"
// or "key" if the value is empty. ok is false if the domain is not
// configured.
//
// unit is the descriptor's envoy.type.v3.RateLimitUnit, converted; it may
// be UnitUnknown, whose Duration is 0, if Envoy sends no unit.
func (r *Rules) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) (m Match, ok bool) {
	d := r.domains[domain]
	if d == nil {
		return Match{}, false
	}
	return Match{
		Domain:   domain,
		Limit:    Limit{RequestsPerUnit: requestsPerUnit, Unit: unit},
		dom:      d,
		entries:  entries,
		override: true,
	}, true
}

// StatsKey returns the key the original names the match's stats with (it
// appends ".total_hits", ".over_limit" and so on to it, after replacing
// ':' and '|' and the dots of IPv4 addresses with underscores):
//
//   - by default, the domain and the composite keys of the descriptors
//     matched, such as "test-domain.key1_value1.subkey1";
//   - for each level matched by key alone whose descriptor has
//     value_to_metric, the entry's value is added ("route_GET"), and for a
//     level matched by a wildcard with value_to_metric, the entry's value
//     replaces the pattern;
//   - if the matched descriptor has detailed_metric, every entry's key and
//     value ("key1_value1.subkey1_x"), except that an entry matched by a
//     wildcard with share_threshold shows the pattern ("files_files/*").
//
// It does not allocate when the key is the configured one, the common
// case; otherwise it builds the key, with one allocation if it is shorter
// than 256 bytes. The zero Match has the key "".
func (m *Match) StatsKey() string {
	if m.static {
		return m.leaf.fullKey
	}
	if m.dom == nil {
		return ""
	}
	var buf [bufSize]byte
	return string(m.AppendStatsKey(buf[:0]))
}

// AppendStatsKey appends the StatsKey to dst and returns the extended
// buffer.
func (m *Match) AppendStatsKey(dst []byte) []byte {
	if m.static {
		return append(dst, m.leaf.fullKey...)
	}
	if m.dom == nil {
		return dst
	}
	dst = append(dst, m.Domain...)
	if m.override {
		dst = append(dst, '.')
		for i, e := range m.entries {
			if i > 0 {
				dst = append(dst, '.')
			}
			dst = append(dst, e.Key...)
			if e.Value != "" {
				dst = append(dst, '_')
				dst = append(dst, e.Value...)
			}
		}
		return dst
	}
	// walk's loop, written out: a closure appending to dst would move dst
	// to the heap.
	var arr [bufSize]byte
	buf := arr[:0]
	cur := &m.dom.root
	for _, e := range m.entries {
		var k kind
		if cur, k, buf = cur.step(e, buf); cur == nil {
			break // the entries changed since Lookup
		}
		val, sep := segment(m.mode, e, cur, k)
		dst = append(dst, '.')
		dst = append(dst, e.Key...)
		if sep {
			dst = append(dst, '_')
			dst = append(dst, val...)
		}
	}
	return dst
}

// SharedPatterns appends to dst, for each entry, the pattern that its
// value is replaced by in cache keys because the entry matched a wildcard
// with share_threshold ("files/*" for an entry "files" matched by
// "files_files/*"), or "" for an entry that shares nothing; it is the
// original's ShareThresholdKeyPattern. It appends nothing when no entry
// shares a threshold.
func (m *Match) SharedPatterns(dst []string) []string {
	if !m.shared {
		return dst
	}
	m.walk(func(e Entry, n *node, k kind) {
		p, _ := sharePattern(e, n, k)
		dst = append(dst, p)
	})
	return dst
}

// ReplacedBy reports whether the match's limit is dropped because one of
// the matches of the same request, all (which may hold m and zero
// Matches), lists its name in replaces. A limit without a name, or an
// unlimited one, is never replaced; an unlimited one still replaces
// others. The original applies the same rule across the descriptors of a
// request.
func (m *Match) ReplacedBy(all []Match) bool {
	name := m.Limit.Name
	if name == "" || m.Limit.Unlimited {
		return false
	}
	for i := range all {
		for _, r := range all[i].Limit.Replaces {
			if r == name {
				return true
			}
		}
	}
	return false
}

// walk matches the entries again, calling fn with the descriptor each
// matched and how. It is only called on a Match found by Lookup, so every
// entry matches.
func (m *Match) walk(fn func(e Entry, n *node, k kind)) {
	var arr [bufSize]byte
	buf := arr[:0]
	cur := &m.dom.root
	for _, e := range m.entries {
		var k kind
		if cur, k, buf = cur.step(e, buf); cur == nil {
			return // the entries changed since Lookup
		}
		fn(e, cur, k)
	}
}

// step returns the child of n that e matches, and how. buf is scratch
// space for the composite key, returned for reuse.
func (n *node) step(e Entry, buf []byte) (*node, kind, []byte) {
	buf = append(buf[:0], e.Key...)
	buf = append(buf, '_')
	buf = append(buf, e.Value...)
	if c := n.children[string(buf)]; c != nil {
		return c, byValue, buf
	}
	for _, w := range n.wildcards {
		if w.match(buf) {
			return w.node, byWildcard, buf
		}
	}
	if c := n.children[e.Key]; c != nil {
		return c, byKey, buf
	}
	return nil, 0, buf
}

// match reports whether s matches the wildcard, as the original's
// wildcardMatch decides: s starts with the first part and ends with the
// last, is at least as long as all parts together, and holds the middle
// parts in order between them.
func (w *wildcard) match(s []byte) bool {
	parts := w.parts
	first, last := parts[0], parts[len(parts)-1]
	if !bytes.HasPrefix(s, first) || !bytes.HasSuffix(s, last) {
		return false
	}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if len(s) < total {
		return false
	}
	rest := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := bytes.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// sharePattern returns the pattern that replaces e's value when e matched
// n by a wildcard with share_threshold: n's composite key without e's key
// and the underscore after it.
func sharePattern(e Entry, n *node, k kind) (string, bool) {
	if k != byWildcard || !n.shareThreshold {
		return "", false
	}
	p := trimKey(n.composite, e.Key)
	return p, p != ""
}

// trimKey returns composite without the prefix key + "_", if it has it.
func trimKey(composite, key string) string {
	if len(composite) > len(key) && composite[:len(key)] == key && composite[len(key)] == '_' {
		return composite[len(key)+1:]
	}
	return composite
}

// segment returns the value part of the stats key's segment for entry e,
// which matched n by k: the segment is e.Key, then, if sep, an underscore
// and val. It follows the original's GetLimit.
func segment(mode keyMode, e Entry, n *node, k kind) (val string, sep bool) {
	switch mode {
	case modeDetailed:
		return e.Value, true
	case modeShared:
		if p, ok := sharePattern(e, n, k); ok {
			return p, true
		}
		return e.Value, e.Value != ""
	}
	switch k {
	case byValue:
		val = e.Value
	case byWildcard:
		p, shared := sharePattern(e, n, k)
		switch {
		case shared:
			val = p
		case n.valueToMetric:
			val = e.Value
		default:
			val = trimKey(n.composite, e.Key)
		}
	case byKey:
		if n.valueToMetric {
			val = e.Value
		}
	}
	return val, val != ""
}

// segmentIs reports whether composite is key, followed, if sep, by an
// underscore and val.
func segmentIs(composite, key string, sep bool, val string) bool {
	if !sep {
		return composite == key
	}
	return len(composite) == len(key)+1+len(val) &&
		composite[:len(key)] == key && composite[len(key)] == '_' && composite[len(key)+1:] == val
}
