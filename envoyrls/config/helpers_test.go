package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// lookup is one Lookup (or, with override set, Override) and what it must
// find: nil for nothing.
type lookup struct {
	domain   string
	entries  []config.Entry
	override *config.Limit
	want     *hit
}

// hit is what a lookup must find.
type hit struct {
	rpu       uint32
	unit      config.Unit
	key       string // StatsKey
	name      string
	unlimited bool
	shadow    bool
	detailed  bool
	shared    []string       // SharedPatterns, nil if none
	metadata  map[string]any // nil if none
}

// es builds entries from key, value pairs.
func es(kv ...string) []config.Entry {
	e := make([]config.Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		e = append(e, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return e
}

// fill replaces each %s of format with the next arg.
func fill(format string, args ...string) string {
	for _, a := range args {
		format = strings.Replace(format, "%s", a, 1)
	}
	return format
}

// minute returns a hit of n per minute under key.
func minute(n uint32, key string) *hit { return &hit{rpu: n, unit: config.UnitMinute, key: key} }

// shared returns h with its shared patterns set.
func (h *hit) sharing(p ...string) *hit { h.shared = p; return h }

// checkLookup runs l on rules.
func checkLookup(t *testing.T, rules *config.Rules, i int, l lookup) {
	t.Helper()
	var m config.Match
	var ok bool
	if l.override != nil {
		m, ok = rules.Override(l.domain, l.entries, l.override.RequestsPerUnit, l.override.Unit)
	} else {
		m, ok = rules.Lookup(l.domain, l.entries)
	}
	if l.want == nil {
		if ok {
			t.Errorf("#%d Lookup(%q, %v) = %q, want no match", i, l.domain, l.entries, m.StatsKey())
		}
		return
	}
	if !ok {
		t.Errorf("#%d Lookup(%q, %v): no match, want %q", i, l.domain, l.entries, l.want.key)
		return
	}
	w := l.want
	got := hit{
		rpu: m.Limit.RequestsPerUnit, unit: m.Limit.Unit, key: m.StatsKey(), name: m.Limit.Name,
		unlimited: m.Limit.Unlimited, shadow: m.ShadowMode, detailed: m.DetailedMetric,
		shared: m.SharedPatterns(nil), metadata: m.Metadata,
	}
	if !reflect.DeepEqual(got, *w) {
		t.Errorf("#%d Lookup(%q, %v):\n got %+v\nwant %+v", i, l.domain, l.entries, got, *w)
	}
	if b := string(m.AppendStatsKey([]byte("x"))); b != "x"+w.key {
		t.Errorf("#%d AppendStatsKey = %q, want %q", i, b, "x"+w.key)
	}
}
