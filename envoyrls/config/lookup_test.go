package config_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// mustLoad loads YAML documents, one file each, or fails the test.
func mustLoad(t testing.TB, docs ...string) *config.Rules {
	t.Helper()
	files := make([]config.File, len(docs))
	for i, d := range docs {
		files[i] = config.File{Name: "test.yaml", Data: []byte(d)}
	}
	r, err := config.Load(files, config.Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return r
}

// The README's examples, and a few of our own.
const (
	messaging = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: region
    value: eu
    rate_limit: {unit: hour, requests_per_unit: 7}
`
	edgeProxy = `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`
	wildcards = `
domain: w
descriptors:
  - key: path
    value: /api/v1/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
  # The wildcard is in the key: it applies to the composite key_value.
  - key: ho*
    rate_limit: {unit: second, requests_per_unit: 5}
  # Composite keys join key and value with an underscore.
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: x
    value: y
    rate_limit: {unit: second, requests_per_unit: 7}
`
	replaces = `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: free
    rate_limit:
      name: free_pass
      unlimited: true
      replaces:
        - name: specific_limit
  - key: vip
    rate_limit:
      unit: second
      requests_per_unit: 100
      replaces:
        - name: free_pass
`
)

func TestLookupNested(t *testing.T) {
	r := mustLoad(t, messaging)
	for i, l := range []lookup{
		{domain: "messaging", entries: es("message_type", "marketing", "to_number", "2061111111"),
			want: &hit{rpu: 5, unit: config.UnitDay, key: "messaging.message_type_marketing.to_number"}},
		{domain: "messaging", entries: es("message_type", "marketing", "to_number", "2062222222"),
			want: &hit{rpu: 5, unit: config.UnitDay, key: "messaging.message_type_marketing.to_number"}},
		{domain: "messaging", entries: es("to_number", "2061111111"),
			want: &hit{rpu: 100, unit: config.UnitDay, key: "messaging.to_number"}},
		// A level without a rate_limit limits nothing.
		{domain: "messaging", entries: es("message_type", "marketing")},
		// Another message type has no descriptor.
		{domain: "messaging", entries: es("message_type", "transactional", "to_number", "2061111111")},
		// More entries than levels: no match, although to_number has a limit.
		{domain: "messaging", entries: es("to_number", "2061111111", "extra", "x")},
		{domain: "messaging", entries: es("region", "eu", "zone", "a")},
		{domain: "messaging", entries: es("region", "eu"), want: &hit{rpu: 7, unit: config.UnitHour, key: "messaging.region_eu"}},
		// Keys and values are case-sensitive.
		{domain: "messaging", entries: es("Region", "eu")},
		{domain: "messaging", entries: es("region", "EU")},
		{domain: "Messaging", entries: es("region", "eu")},
	} {
		checkLookup(t, r, i, l)
	}
}

func TestLookupValueBeforeKey(t *testing.T) {
	r := mustLoad(t, edgeProxy)
	for i, l := range []lookup{
		{domain: "edge_proxy_per_ip", entries: es("remote_address", "50.0.0.1"),
			want: &hit{rpu: 10, unit: config.UnitSecond, key: "edge_proxy_per_ip.remote_address"}},
		{domain: "edge_proxy_per_ip", entries: es("remote_address", "50.0.0.5"),
			want: &hit{rpu: 0, unit: config.UnitSecond, key: "edge_proxy_per_ip.remote_address_50.0.0.5"}},
		{domain: "edge_proxy_per_ip", entries: es("remote_address", ""),
			want: &hit{rpu: 10, unit: config.UnitSecond, key: "edge_proxy_per_ip.remote_address"}},
	} {
		checkLookup(t, r, i, l)
	}
}

func TestLookupWildcards(t *testing.T) {
	r := mustLoad(t, wildcards)
	for i, l := range []lookup{
		// The value first, then the first wildcard in file order, then the key.
		{domain: "w", entries: es("path", "/api/v1/users"), want: &hit{rpu: 1, unit: config.UnitSecond, key: "w.path_/api/v1/users"}},
		{domain: "w", entries: es("path", "/api/v1/orders"), want: &hit{rpu: 2, unit: config.UnitSecond, key: "w.path_/api/*"}},
		{domain: "w", entries: es("path", "/api/"), want: &hit{rpu: 2, unit: config.UnitSecond, key: "w.path_/api/*"}},
		{domain: "w", entries: es("path", "/web"), want: &hit{rpu: 4, unit: config.UnitSecond, key: "w.path"}},
		{domain: "w", entries: es("path", "/api"), want: &hit{rpu: 4, unit: config.UnitSecond, key: "w.path"}},
		// A wildcard in the key matches "key_value" as a whole; its stats
		// key is the request's key and the pattern.
		{domain: "w", entries: es("host", "example.com"), want: &hit{rpu: 5, unit: config.UnitSecond, key: "w.host_ho*"}},
		{domain: "w", entries: es("ho", ""), want: &hit{rpu: 5, unit: config.UnitSecond, key: "w.ho_ho*"}},
		{domain: "w", entries: es("hx", "o")},
		// Key "a_b" and value "c" make the composite key of key "a" and
		// value "b_c".
		{domain: "w", entries: es("a", "b_c"), want: &hit{rpu: 6, unit: config.UnitSecond, key: "w.a_b_c"}},
		{domain: "w", entries: es("a_b", "c"), want: &hit{rpu: 6, unit: config.UnitSecond, key: "w.a_b_c"}},
		// Key "x_y" falls back to the key alone, "x_y": that of key "x"
		// and value "y".
		{domain: "w", entries: es("x_y", "z"), want: &hit{rpu: 7, unit: config.UnitSecond, key: "w.x_y"}},
	} {
		checkLookup(t, r, i, l)
	}
}

func TestLookupUnlimited(t *testing.T) {
	r := mustLoad(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
  # Accepted by the original: only a valid unit is refused with unlimited.
  - key: counted
    rate_limit:
      unlimited: true
      requests_per_unit: 25
  - key: odd_unit
    rate_limit:
      unlimited: true
      unit: fortnight
  - key: unknown_unit
    rate_limit:
      unlimited: true
      unit: unknown
`)
	for i, l := range []lookup{
		{domain: "internal", entries: es("ldap", "x"), want: &hit{unlimited: true, key: "internal.ldap"}},
		{domain: "internal", entries: es("azure", "x"), want: &hit{rpu: 100, unit: config.UnitMinute, key: "internal.azure"}},
		{domain: "internal", entries: es("counted", "x"), want: &hit{rpu: 25, unlimited: true, key: "internal.counted"}},
		{domain: "internal", entries: es("odd_unit", "x"), want: &hit{unlimited: true, key: "internal.odd_unit"}},
		{domain: "internal", entries: es("unknown_unit", "x"), want: &hit{unlimited: true, key: "internal.unknown_unit"}},
	} {
		checkLookup(t, r, i, l)
	}
}

func TestUnits(t *testing.T) {
	for _, tt := range []struct {
		unit string
		want config.Unit
		dur  time.Duration
		name string
	}{
		{"second", config.UnitSecond, time.Second, "second"},
		{"SECOND", config.UnitSecond, time.Second, "second"},
		{"Minute", config.UnitMinute, time.Minute, "minute"},
		{"hour", config.UnitHour, time.Hour, "hour"},
		{"day", config.UnitDay, 24 * time.Hour, "day"},
		{"week", config.UnitWeek, 7 * 24 * time.Hour, "week"},
		{"month", config.UnitMonth, 30 * 24 * time.Hour, "month"},
		{"year", config.UnitYear, 365 * 24 * time.Hour, "year"},
		// strings.ToUpper, as the original upper-cases: the long s is S.
		{"\u017fecond", config.UnitSecond, time.Second, "second"},
	} {
		r, err := config.Load([]config.File{{Name: "u.yaml", Data: []byte(
			"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + tt.unit + ", requests_per_unit: 3}\n")}}, config.Options{})
		if err != nil {
			t.Errorf("unit %q: Load: %v", tt.unit, err)
			continue
		}
		m, ok := r.Lookup("d", es("k", "v"))
		if !ok || m.Limit.Unit != tt.want || m.Limit.Unit.Duration() != tt.dur || m.Limit.Unit.String() != tt.name {
			t.Errorf("unit %q: got %v %v (%v, %v), want %v (%v, %v)", tt.unit, ok, m.Limit.Unit, m.Limit.Unit.Duration(),
				m.Limit.Unit.String(), tt.want, tt.dur, tt.name)
		}
	}
	if got := config.UnitUnknown.Duration(); got != 0 {
		t.Errorf("UnitUnknown.Duration() = %v, want 0", got)
	}
	if got := config.Unit(9).String(); got != "Unit(9)" {
		t.Errorf("Unit(9).String() = %q, want Unit(9)", got)
	}
	if got := config.Unit(-1).Duration(); got != 0 {
		t.Errorf("Unit(-1).Duration() = %v, want 0", got)
	}
}

func TestLookupShadowMode(t *testing.T) {
	r := mustLoad(t, `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        quota_mode: true
        rate_limit: {requests_per_unit: 10, unit: second}
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
`)
	a, ok := r.Lookup("example6", es("service", "auth-service", "user", "user-a"))
	if !ok || !a.ShadowMode || !a.QuotaMode || a.Limit.RequestsPerUnit != 10 {
		t.Errorf("user-a: ok %v, %+v, want shadow and quota mode, 10/s", ok, a)
	}
	b, ok := r.Lookup("example6", es("service", "auth-service", "user", "user-b"))
	if !ok || b.ShadowMode || b.QuotaMode || b.Limit.RequestsPerUnit != 20 {
		t.Errorf("user-b: ok %v, %+v, want no shadow mode, 20/s", ok, b)
	}
	if got, want := b.Path, "service.user_user-b"; got != want {
		t.Errorf("Path = %q, want %q", got, want)
	}
}

func TestReplacedBy(t *testing.T) {
	r := mustLoad(t, replaces)
	get := func(kv ...string) config.Match {
		m, ok := r.Lookup("example7", es(kv...))
		if !ok {
			t.Fatalf("Lookup(%v): no match", kv)
		}
		return m
	}
	one := get("key_1", "value_1", "user", "bkthomps")
	two := get("key_2", "value_2", "user", "bkthomps")
	free := get("free", "x")
	vip := get("vip", "x")
	for i, tt := range []struct {
		request []config.Match
		want    []bool // ReplacedBy for each
	}{
		{[]config.Match{one}, []bool{false}},
		{[]config.Match{two}, []bool{false}},
		{[]config.Match{one, two}, []bool{true, false}},
		{[]config.Match{two, one, {}}, []bool{false, true, false}},
		// An unlimited limit replaces others but is never replaced.
		{[]config.Match{one, free}, []bool{true, false}},
		{[]config.Match{free, vip}, []bool{false, false}},
	} {
		for j := range tt.request {
			if got := tt.request[j].ReplacedBy(tt.request); got != tt.want[j] {
				t.Errorf("#%d: match %d (%q) ReplacedBy = %v, want %v", i, j, tt.request[j].Limit.Name, got, tt.want[j])
			}
		}
	}
	if want := []string{"specific_limit"}; !reflect.DeepEqual(two.Limit.Replaces, want) {
		t.Errorf("Replaces = %q, want %q", two.Limit.Replaces, want)
	}
}

func TestLookupDetailedMetric(t *testing.T) {
	r := mustLoad(t, `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: parent
    descriptors:
      - key: child
        value: c*
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 30}
`)
	for i, l := range []lookup{
		{domain: "example8", entries: es("key1", "unspecified_value"),
			want: &hit{rpu: 10, unit: config.UnitMinute, detailed: true, key: "example8.key1_unspecified_value"}},
		{domain: "example8", entries: es("key1", "unspecified_value2"),
			want: &hit{rpu: 10, unit: config.UnitMinute, detailed: true, key: "example8.key1_unspecified_value2"}},
		{domain: "example8", entries: es("key1", "value1"), want: minute(20, "example8.key1_value1")},
		// Every entry shows its value, even an empty one.
		{domain: "example8", entries: es("key1", ""),
			want: &hit{rpu: 10, unit: config.UnitMinute, detailed: true, key: "example8.key1_"}},
		{domain: "example8", entries: es("parent", "p", "child", "c42"),
			want: &hit{rpu: 30, unit: config.UnitMinute, detailed: true, key: "example8.parent_p.child_c42"}},
	} {
		checkLookup(t, r, i, l)
	}
}

func TestOverride(t *testing.T) {
	r := mustLoad(t, messaging)
	m, ok := r.Override("messaging", es("k1", "", "k2", "v"), 9, config.UnitWeek)
	if !ok {
		t.Fatal("Override: not ok")
	}
	if got, want := m.StatsKey(), "messaging.k1.k2_v"; got != want {
		t.Errorf("StatsKey = %q, want %q", got, want)
	}
	if m.Path != "" || m.ShadowMode || m.Limit.Name != "" || m.Limit.Unit.Duration() != 7*24*time.Hour {
		t.Errorf("Override = %+v", m)
	}
	if m, _ := r.Override("messaging", nil, 1, config.UnitSecond); m.StatsKey() != "messaging." {
		t.Errorf("StatsKey of no entries = %q, want %q", m.StatsKey(), "messaging.")
	}
	if p := m.SharedPatterns(nil); p != nil {
		t.Errorf("SharedPatterns = %q, want none", p)
	}
	if _, ok := r.Override("nowhere", es("k", "v"), 1, config.UnitSecond); ok {
		t.Error("Override in an unknown domain: ok")
	}
}

func TestZeroValues(t *testing.T) {
	var r config.Rules
	if _, ok := r.Lookup("d", es("k", "v")); ok {
		t.Error("zero Rules: Lookup found something")
	}
	if r.HasDomain("d") || len(r.Domains()) != 0 || r.Dump() != "" {
		t.Error("zero Rules has a domain")
	}
	var m config.Match
	if m.StatsKey() != "" || len(m.AppendStatsKey(nil)) != 0 || m.SharedPatterns(nil) != nil || m.ReplacedBy(nil) {
		t.Error("zero Match is not empty")
	}
}

func TestDumpAndDomains(t *testing.T) {
	r := mustLoad(t, messaging, edgeProxy)
	want := "" +
		"edge_proxy_per_ip.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false\n" +
		"edge_proxy_per_ip.remote_address_50.0.0.5: unit=SECOND requests_per_unit=0, shadow_mode: false, quota_mode: false\n" +
		"messaging.message_type_marketing.to_number: unit=DAY requests_per_unit=5, shadow_mode: false, quota_mode: false\n" +
		"messaging.region_eu: unit=HOUR requests_per_unit=7, shadow_mode: false, quota_mode: false\n" +
		"messaging.to_number: unit=DAY requests_per_unit=100, shadow_mode: false, quota_mode: false\n"
	if got := r.Dump(); got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
	if got, want := r.Domains(), []string{"edge_proxy_per_ip", "messaging"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Domains = %q, want %q", got, want)
	}
	if !r.HasDomain("messaging") || r.HasDomain("other") {
		t.Error("HasDomain is wrong")
	}
}

// TestLookupAllocs checks that Lookup, and StatsKey of a configured key,
// do not allocate, and that AppendStatsKey into a buffer does not either.
func TestLookupAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := mustLoad(t, messaging, `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: id
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	static := es("message_type", "marketing", "to_number", "2061111111")
	dynamic := es("route", "r1", "id", "42")
	buf := make([]byte, 0, 64)
	var sink int
	if n := testing.AllocsPerRun(100, func() {
		m, ok := r.Lookup("messaging", static)
		if ok {
			sink += len(m.StatsKey())
		}
		m, ok = r.Lookup("d", dynamic)
		if ok {
			buf = m.AppendStatsKey(buf[:0])
			sink += len(buf)
		}
		if _, ok := r.Lookup("messaging", es2); ok {
			sink++
		}
	}); n != 0 {
		t.Errorf("Lookup allocates %v times, want 0", n)
	}
	if string(buf) != "d.route_r1.id_42" {
		t.Errorf("AppendStatsKey = %q", buf)
	}
	_ = sink
}

// es2 is a lookup that misses, for TestLookupAllocs.
var es2 = es("to_number", "1", "more", "2")
