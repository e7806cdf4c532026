package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// TestMode loads the mode field, this package's own, and checks the mode
// each lookup finds.
func TestMode(t *testing.T) {
	r := mustLoad(t, `
domain: d
descriptors:
  - key: none
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: lease
    rate_limit: {unit: second, requests_per_unit: 1, mode: lease}
  - key: optimistic
    rate_limit: {unit: minute, requests_per_unit: 2, mode: Optimistic}
  - key: exact
    rate_limit: {unit: hour, requests_per_unit: 3, mode: EXACT}
  - key: unlimited
    rate_limit: {unlimited: true, mode: exact}
  - key: parent
    descriptors:
      - key: child
        rate_limit:
          unit: day
          requests_per_unit: 4
          mode: optimistic
          name: child
          replaces: [{name: other}]
`)
	for i, st := range []struct {
		entries   []config.Entry
		mode      config.Mode
		unlimited bool
	}{
		{es("none", "x"), config.ModeDefault, false},
		{es("lease", "x"), config.ModeLease, false},
		{es("optimistic", "x"), config.ModeOptimistic, false},
		{es("exact", "x"), config.ModeExact, false},
		{es("unlimited", "x"), config.ModeExact, true},
		{es("parent", "p", "child", "c"), config.ModeOptimistic, false},
	} {
		m, ok := r.Lookup("d", st.entries)
		if !ok {
			t.Errorf("#%d Lookup(%v): no match", i, st.entries)
			continue
		}
		if m.Limit.Mode != st.mode || m.Limit.Unlimited != st.unlimited {
			t.Errorf("#%d Lookup(%v): mode %v, unlimited %t; want %v, %t", i, st.entries, m.Limit.Mode, m.Limit.Unlimited, st.mode, st.unlimited)
		}
	}
	if m, _ := r.Override("d", es("exact", "x"), 5, config.UnitSecond); m.Limit.Mode != config.ModeDefault {
		t.Errorf("Override: mode %v, want %v", m.Limit.Mode, config.ModeDefault)
	}
	dump := r.Dump()
	for _, line := range []string{
		"d.exact: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false, mode: exact\n",
		"d.none: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false\n",
		"d.parent.child: unit=DAY requests_per_unit=4, shadow_mode: false, quota_mode: false, mode: optimistic\n",
	} {
		if !strings.Contains(dump, line) {
			t.Errorf("Dump lacks %q:\n%s", line, dump)
		}
	}
}

// TestModeRejects loads documents with a mode field that is wrong, or
// in the wrong place.
func TestModeRejects(t *testing.T) {
	for _, tt := range []struct {
		name    string
		doc     string
		wantErr error
		wantMsg string // a fragment
	}{
		{"unknown mode", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, mode: fast}\n",
			config.ErrMode, `descriptor "k": invalid mode "fast" (want lease, optimistic or exact)`},
		{"default is no value", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, mode: default}\n",
			config.ErrMode, `invalid mode "default"`},
		{"a number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, mode: 1}\n",
			config.ErrMode, `invalid mode "1"`},
		{"a map", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, mode: {lease: true}}\n",
			config.ErrUnknownField, `rate_limit.mode: unknown field "lease"`},
		{"in a descriptor", "domain: d\ndescriptors:\n  - key: k\n    mode: lease\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			config.ErrMode, `descriptor "k": invalid mode: the field "mode" belongs in a rate_limit`},
		{"at the top", "domain: d\nmode: lease\n",
			config.ErrMode, `domain "d": invalid mode: the field "mode" belongs in a rate_limit`},
		{"in replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: a, mode: lease}]}\n",
			config.ErrMode, `rate_limit.replaces: invalid mode`},
		{"an invalid unit first", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1, mode: lease}\n",
			config.ErrUnit, `invalid unit "fortnight"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load([]config.File{{Name: "x.yaml", Data: []byte(tt.doc)}}, config.Options{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Load error = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Load error = %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

// TestModeString checks the names of the modes.
func TestModeString(t *testing.T) {
	for m, want := range map[config.Mode]string{
		config.ModeDefault:    "default",
		config.ModeLease:      "lease",
		config.ModeOptimistic: "optimistic",
		config.ModeExact:      "exact",
		config.Mode(9):        "Mode(9)",
	} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", m, got, want)
		}
	}
}
