package reconcile

import "testing"

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
