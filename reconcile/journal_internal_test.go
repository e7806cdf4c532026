package reconcile

import (
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// TestJournalID checks that a journal map key gives back the key and node
// it was made of, keys with zero bytes included.
func TestJournalID(t *testing.T) {
	for _, c := range []struct{ key, node string }{
		{"user:1", ""},
		{"user:1", "127.0.0.1:7000"},
		{"a\x00b", ""},
		{"a\x00b", "127.0.0.1:7000"},
		{"\x00", ""},
		{"", "127.0.0.1:7000"},
	} {
		id := journalID(c.key, c.node)
		if key, node := splitID(id); key != c.key || node != c.node {
			t.Errorf("journalID(%q, %q) = %q, split %q, %q", c.key, c.node, id, key, node)
		}
	}
	if id := journalID("user:1", ""); id != "user:1" {
		t.Errorf("a single Redis's id %q, want the key itself", id)
	}
}

// TestJournalSuffix checks what a loss charges again of a key whose
// settlements both took and gave back: the most they took from any one of
// them on, across slots, never less than 0.
func TestJournalSuffix(t *testing.T) {
	const M = 1_000_000
	sp, err := NewSpec(10, 100, Lease)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		steps []int64 // tokens taken (grants) or given back (negative), 40 ms apart
		want  int64
	}{
		{"grants", []int64{5, 3, 2}, 10},
		{"a grant given back in part", []int64{10, -6, 3}, 7},
		{"given back more than the grants after it", []int64{4, -6, 3}, 3},
		{"across slots", []int64{10, -6, 3, -2, 4}, 9},
		{"a give-back alone", []int64{-5}, 0},
		{"given back, then taken again", []int64{-5, 8}, 8},
	} {
		var j journal
		base := time.Unix(1000, 0)
		for i, n := range c.steps {
			s := global.Settlement{Key: "k"}
			rep := global.Reply{Now: base.Add(time.Duration(i) * 40 * time.Millisecond)}
			if n > 0 {
				rep.Granted = n * M
			} else {
				s.Returned = -n * M
			}
			j.add(sp, "", &s, &rep, time.Minute)
		}
		got := j.since(0, math.MaxInt64, func(string, string) bool { return true })["k"]
		if got.suffix != c.want*M {
			t.Errorf("%s: %v: charged again %d tokens, want %d", c.name, c.steps, got.suffix/M, c.want)
		}
	}
}

// TestJournalTrim: a heartbeat drops the slots older than the journal's
// span though no write comes after them, unless an outage pins them.
func TestJournalTrim(t *testing.T) {
	sp, err := NewSpec(10, 100, Lease)
	if err != nil {
		t.Fatal(err)
	}
	const span = 3 * time.Second
	base := time.Unix(1000, 0)
	fill := func(j *journal) {
		for i := range 100 {
			s := global.Settlement{Key: "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))}
			j.add(sp, "", &s, &global.Reply{Granted: 1_000_000, Now: base.Add(time.Duration(i) * 10 * time.Millisecond)}, span)
		}
	}
	var j journal
	fill(&j)
	if j.n != 100 || len(j.slots) != 10 {
		t.Fatalf("journal of %d entries in %d slots, want 100 in 10", j.n, len(j.slots))
	}
	j.trim(base.Add(span).UnixMicro(), span)
	if j.n != 100 {
		t.Errorf("trimmed at the span's end: %d entries left, want 100", j.n)
	}
	j.trim(base.Add(span+510*time.Millisecond).UnixMicro(), span)
	if j.n != 50 || len(j.slots) != 5 {
		t.Errorf("trimmed 510ms after: %d entries in %d slots left, want 50 in 5", j.n, len(j.slots))
	}
	j.trim(base.Add(span+2*time.Second).UnixMicro(), span)
	if j.n != 0 || len(j.slots) != 0 {
		t.Errorf("trimmed a second after the last write's span: %d entries in %d slots left, want none", j.n, len(j.slots))
	}

	var pinned journal
	fill(&pinned)
	pinned.pin(base.Add(time.Second).UnixMicro(), span)
	pinned.trim(base.Add(time.Hour).UnixMicro(), span)
	if pinned.n != 100 {
		t.Errorf("trimmed during an outage: %d entries left, want the 100 it pins", pinned.n)
	}
}
