package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to Load. It must never panic; an error
// must be an *Error; accepted rules must look up without panicking, and
// find every limited descriptor by its own keys and values.
func FuzzLoad(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k*\n    share_threshold: true\n    value_to_metric: true\n" +
		"    detailed_metric: true\n    rate_limit: {unit: week, requests_per_unit: 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Load([]File{{Name: "fuzz.yaml", Data: data}}, Options{})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Err == nil {
				t.Fatalf("Load error %T %v is not an *Error", err, err)
			}
			_ = err.Error()
			return
		}
		// Entries made of the input, whatever they match.
		words := strings.Fields(string(data))
		var entries []Entry
		for i := 0; i+1 < len(words) && i < 16; i += 2 {
			entries = append(entries, Entry{Key: strings.TrimSuffix(words[i], ":"), Value: words[i+1]})
		}
		for _, name := range r.Domains() {
			d := r.domains[name]
			for n := range entries {
				exercise(t, r, name, entries[:n+1])
			}
			checkTree(t, r, d, &d.root, nil, true)
		}
		_ = r.Dump()
	})
}

// checkTree looks up every descriptor under n by the entries that lead to
// it: keys and values, with each '*' of a pattern replaced by "x". A
// descriptor whose path has no wildcard and values all through is the
// value match of those entries, so Lookup must find it if it has a limit.
func checkTree(t *testing.T, r *Rules, d *domain, n *node, path []Entry, exact bool) {
	for _, c := range n.children {
		value := strings.ReplaceAll(c.value, "*", "x")
		key := strings.ReplaceAll(c.key, "*", "x")
		entries := append(path[:len(path):len(path)], Entry{Key: key, Value: value})
		m, ok := exercise(t, r, d.name, entries)
		exact := exact && c.value != "" && !strings.Contains(c.composite, "*")
		if exact && ok != (c.limit != nil) {
			t.Fatalf("Lookup(%q, %q) ok = %v, want %v", d.name, entries, ok, c.limit != nil)
		}
		if exact && ok && m.Path != c.path() {
			t.Fatalf("Lookup(%q, %q) Path = %q, want %q", d.name, entries, m.Path, c.path())
		}
		if len(path) < 8 {
			checkTree(t, r, d, c, entries, exact)
		}
	}
}

// exercise looks entries up and uses the match every way; a configured
// stats key must be the one built from the entries.
func exercise(t *testing.T, r *Rules, domain string, entries []Entry) (Match, bool) {
	m, ok := r.Lookup(domain, entries)
	if !ok {
		return m, ok
	}
	key := m.StatsKey()
	built := m
	built.static = false
	if got := string(built.AppendStatsKey(nil)); got != key {
		t.Fatalf("Lookup(%q, %q): StatsKey %q, built %q", domain, entries, key, got)
	}
	if p := m.SharedPatterns(nil); p != nil && len(p) != len(entries) {
		t.Fatalf("Lookup(%q, %q): %d shared patterns for %d entries", domain, entries, len(p), len(entries))
	}
	_ = m.ReplacedBy([]Match{m})
	_ = m.Limit.Unit.Duration()
	return m, ok
}
