package runner

import (
	"fmt"
	"testing"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// TestLabelsOf: a stats key's labels are what the original's default
// mapping gives its stat name.
func TestLabelsOf(t *testing.T) {
	for _, c := range []struct {
		key  string
		want labels
	}{
		{"mongo_cps.database_users", labels{"mongo_cps", "database_users", ""}},
		{"messaging.message_type_marketing.to_number", labels{"messaging", "message_type_marketing", "to_number"}},
		{"d.k1_v1.k2_v2.k3_v3.k4_v4", labels{"d", "k1_v1", "k2_v2"}},
		{"d.remote_address_10.0.0.1", labels{"d", "remote_address_10_0_0_1", ""}},
		{"d.path_/a:b|c", labels{"d", "path_/a_b_c", ""}},
		{"d.v_1.2.3", labels{"d", "v_1", "2"}},
		{"d", labels{"d", "", ""}},
	} {
		if got := labelsOf(c.key); got != c.want {
			t.Errorf("labelsOf(%q) = %+v, want %+v", c.key, got, c.want)
		}
	}
}

// TestDescStatsBound: label sets past the bound count in the overflow
// series, stats keys past four times the bound still count under their
// labels, and domain_not_found is bounded alike.
func TestDescStatsBound(t *testing.T) {
	d := newDescStats(2)
	for i := range 20 {
		d.Hits(fmt.Sprintf("d.k_%d", i%3), rls.Hits{Total: 1})
	}
	// Deeper levels of one label set: many stats keys, one series.
	for i := range 20 {
		d.Hits(fmt.Sprintf("d.k_0.a.x_%d", i), rls.Hits{Total: 1, OverLimit: 1})
	}
	got := map[labels]uint64{}
	d.eachSeries(func(s *series) { got[s.labels] = s.total.Load() })
	want := map[labels]uint64{
		{"d", "k_0", ""}: 7,
		{"d", "k_1", ""}: 7,
		{"", "", ""}:     6 + 20, // k_2, and k_0.a, a third label set
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	if n := d.keys.Load(); n > 8 {
		t.Errorf("%d stats keys remembered, more than 4 times the bound", n)
	}
	for i := range 5 {
		d.UnknownDomain(fmt.Sprintf("dom%d", i))
	}
	d.UnknownDomain("dom0")
	domains := map[string]uint64{}
	d.eachDomain(func(dom string, n uint64) { domains[dom] = n })
	if fmt.Sprint(domains) != fmt.Sprint(map[string]uint64{"dom0": 2, "dom1": 1, "": 3}) {
		t.Errorf("domain_not_found %v", domains)
	}
}
