package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// originalCase is one configuration of the original's configuration tests
// (test/config/config_test.go), named as the original names its test, with
// the outcome the original asserts: rejected with an error that wraps
// wantErr and whose message is wantMsg, or accepted with the lookups'
// results.
type originalCase struct {
	name    string
	files   []string // in testdata
	inline  []string // YAML, for the original's configurations built in Go
	merge   bool     // MERGE_DOMAIN_CONFIG
	wantErr error
	wantMsg string
	lookups []lookup
}

// The inline configurations of the original's Go-built tests.
const (
	detailedTwoLevels = `
domain: nested
descriptors:
  - key: key-1
    detailed_metric: %s
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        detailed_metric: %s
        rate_limit: {unit: minute, requests_per_unit: 5}
`
	detailedRealistic = `
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
`
	routeMethodSubject = `
domain: %s
descriptors:
  - key: route
    value_to_metric: %s
    descriptors:
      - key: http_method
        value_to_metric: %s
        descriptors:
          - key: subject_id
            detailed_metric: %s
            rate_limit: {unit: minute, requests_per_unit: 60}
`
	wildStats = `
domain: test-domain
descriptors:
  - key: wild
    value: %s
    share_threshold: %s
    value_to_metric: %s
    rate_limit: {unit: minute, requests_per_unit: 20}
`
)

var originalCases = []originalCase{
	{
		name:  "TestBasicConfig",
		files: []string{"basic_config.yaml"},
		lookups: []lookup{
			{domain: "foo_domain", entries: nil},
			{domain: "test-domain", entries: nil},
			{domain: "test-domain", entries: es("key1", "something")},
			{domain: "test-domain", entries: es("key1", "value1")},
			{domain: "test-domain", entries: es("key2", "value2", "subkey", "subvalue")},
			{domain: "test-domain", entries: es("key5", "value5", "subkey5", "subvalue")},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something"),
				want: &hit{rpu: 5, unit: config.UnitSecond, key: "test-domain.key1_value1.subkey1"}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "subvalue1"),
				want: &hit{rpu: 10, unit: config.UnitSecond, key: "test-domain.key1_value1.subkey1_subvalue1"}},
			{domain: "test-domain", entries: es("key2", "something"), want: minute(20, "test-domain.key2")},
			{domain: "test-domain", entries: es("key2", "value2"), want: minute(30, "test-domain.key2_value2")},
			{domain: "test-domain", entries: es("key2", "value3")},
			{domain: "test-domain", entries: es("key3", "foo"), want: &hit{rpu: 1, unit: config.UnitHour, key: "test-domain.key3"}},
			{domain: "test-domain", entries: es("key4", "foo"),
				want: &hit{rpu: 1, unit: config.UnitDay, key: "test-domain.key4", name: "key4_rate_limit"}},
			{domain: "test-domain", entries: es("key6", "foo"), want: &hit{unlimited: true, key: "test-domain.key6"}},
			{domain: "test-domain", entries: es("key7", "unspecified_value"),
				want: &hit{rpu: 70, unit: config.UnitMinute, detailed: true, key: "test-domain.key7_unspecified_value"}},
			{domain: "test-domain", entries: es("key7", "another_value"),
				want: &hit{rpu: 70, unit: config.UnitMinute, detailed: true, key: "test-domain.key7_another_value"}},
		},
	},
	{
		name:  "TestDomainMerge",
		files: []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"},
		merge: true,
		lookups: []lookup{
			{domain: "foo_domain"},
			{domain: "test-domain"},
			{domain: "test-domain", entries: es("key1", "value1"), want: minute(10, "test-domain.key1_value1")},
			{domain: "test-domain", entries: es("key2", "value2"), want: minute(20, "test-domain.key2_value2")},
		},
	},
	{
		name:  "TestConfigLimitOverride",
		files: []string{"basic_config.yaml"},
		lookups: []lookup{
			{domain: "foo_domain", override: &config.Limit{RequestsPerUnit: 10, Unit: config.UnitDay}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something"),
				override: &config.Limit{RequestsPerUnit: 10, Unit: config.UnitDay},
				want:     &hit{rpu: 10, unit: config.UnitDay, key: "test-domain.key1_value1.subkey1_something"}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something"),
				override: &config.Limit{RequestsPerUnit: 42, Unit: config.UnitHour},
				want:     &hit{rpu: 42, unit: config.UnitHour, key: "test-domain.key1_value1.subkey1_something"}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something_else"),
				override: &config.Limit{RequestsPerUnit: 42, Unit: config.UnitHour},
				want:     &hit{rpu: 42, unit: config.UnitHour, key: "test-domain.key1_value1.subkey1_something_else"}},
		},
	},
	{
		name: "TestEmptyDomain", files: []string{"empty_domain.yaml"},
		wantErr: config.ErrEmptyDomain, wantMsg: "config: empty_domain.yaml: empty domain",
	},
	{
		name: "TestDuplicateDomain", files: []string{"basic_config.yaml", "duplicate_domain.yaml"},
		wantErr: config.ErrDuplicateDomain,
		wantMsg: `config: duplicate_domain.yaml: domain "test-domain": duplicate domain (also in basic_config.yaml)`,
	},
	{
		name: "TestEmptyKey", files: []string{"empty_key.yaml"},
		wantErr: config.ErrEmptyKey,
		wantMsg: `config: empty_key.yaml: domain "test-domain": empty key (entry 1 of descriptors)`,
	},
	{
		name: "TestDuplicateKey", files: []string{"duplicate_key.yaml"},
		wantErr: config.ErrDuplicateKey,
		wantMsg: `config: duplicate_key.yaml: domain "test-domain": descriptor "key1_value1": duplicate key`,
	},
	{
		name: "TestDuplicateKeyDomainMerge", files: []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, merge: true,
		wantErr: config.ErrDuplicateKey,
		wantMsg: `config: merge_domain_key1.yaml: domain "test-domain": descriptor "key1_value1": duplicate key`,
	},
	{
		name: "TestBadLimitUnit", files: []string{"bad_limit_unit.yaml"},
		wantErr: config.ErrUnit,
		wantMsg: `config: bad_limit_unit.yaml: domain "test-domain": descriptor "key1_value1": invalid unit "fortnight"`,
	},
	{
		name: "TestReplacesSelf", files: []string{"replaces_self.yaml"},
		wantErr: config.ErrReplacesSelf,
		wantMsg: `config: replaces_self.yaml: domain "test-domain": descriptor "key1_value1.subkey1": rate_limit replaces its own name "self"`,
	},
	{
		name: "TestReplacesEmpty", files: []string{"replaces_empty.yaml"},
		wantErr: config.ErrReplacesEmpty,
		wantMsg: `config: replaces_empty.yaml: domain "test-domain": descriptor "key1_value1.subkey1": replaces entry without a name (entry 1)`,
	},
	{
		name: "TestBadYaml", files: []string{"bad_yaml.yaml"},
		wantErr: config.ErrSyntax,
		wantMsg: "config: bad_yaml.yaml: invalid YAML: yaml: line 2: found unexpected end of stream",
	},
	{
		name: "TestMisspelledKey/ratelimit", files: []string{"misspelled_key.yaml"},
		wantErr: config.ErrUnknownField,
		wantMsg: `config: misspelled_key.yaml: domain "test-domain": descriptor "key1_value1": unknown field "ratelimit"`,
	},
	{
		name: "TestMisspelledKey/requestsperunit", files: []string{"misspelled_key2.yaml"},
		wantErr: config.ErrUnknownField,
		wantMsg: `config: misspelled_key2.yaml: domain "test-domain": descriptor "key1_value1": rate_limit: unknown field "requestsperunit"`,
	},
	{
		name: "TestNonStringKey", files: []string{"non_string_key.yaml"},
		wantErr: config.ErrFieldName,
		wantMsg: "config: non_string_key.yaml: field name is not a string: 0.25",
	},
	{
		name: "TestNonMapList", files: []string{"non_map_list.yaml"},
		wantErr: config.ErrNotMap,
		wantMsg: `config: non_map_list.yaml: domain "test-domain": descriptors: list element is not a map: a`,
	},
	{
		name: "TestUnlimitedWithRateLimitUnit", files: []string{"unlimited_with_unit.yaml"},
		wantErr: config.ErrUnlimitedUnit,
		wantMsg: `config: unlimited_with_unit.yaml: domain "test-domain": descriptor "foo": unit set on an unlimited rate_limit ("day")`,
	},
	{
		name:  "TestShadowModeConfig",
		files: []string{"shadowmode_config.yaml"},
		lookups: []lookup{
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something"),
				want: &hit{rpu: 5, unit: config.UnitSecond, key: "test-domain.key1_value1.subkey1"}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "subvalue1"),
				want: &hit{rpu: 10, unit: config.UnitSecond, shadow: true, key: "test-domain.key1_value1.subkey1_subvalue1"}},
			{domain: "test-domain", entries: es("key2", "something"),
				want: &hit{rpu: 20, unit: config.UnitMinute, shadow: true, key: "test-domain.key2"}},
			{domain: "test-domain", entries: es("key2", "value2"), want: minute(30, "test-domain.key2_value2")},
		},
	},
	{
		name:  "TestWildcardConfig",
		files: []string{"wildcard.yaml"},
		lookups: []lookup{
			{domain: "test-domain", entries: es("noVal", "foo1"), want: minute(20, "test-domain.noVal")},
			{domain: "test-domain", entries: es("noVal", "foo2"), want: minute(20, "test-domain.noVal")},
			{domain: "test-domain", entries: es("wild", "foo1"), want: minute(20, "test-domain.wild_foo*")},
			{domain: "test-domain", entries: es("wild", "foo2"), want: minute(20, "test-domain.wild_foo*")},
			{domain: "test-domain", entries: es("nestedWild", "val1", "wild", "goo2"),
				want: minute(20, "test-domain.nestedWild_val1.wild_goo*")},
			{domain: "test-domain", entries: es("wild", "bar")},
			{domain: "test-domain", entries: es("noWild", "foo1")},
			{domain: "test-domain", entries: es("midWild", "barab"), want: minute(20, "test-domain.midWild_bar*b")},
			{domain: "test-domain", entries: es("midWild", "bar123b"), want: minute(20, "test-domain.midWild_bar*b")},
			{domain: "test-domain", entries: es("midWild", "barb"), want: minute(20, "test-domain.midWild_bar*b")},
			{domain: "test-domain", entries: es("midWild", "bara")},
			{domain: "test-domain", entries: es("midWild", "xbarb")},
			{domain: "test-domain", entries: es("multiWild", "foo123bar456baz"), want: minute(10, "test-domain.multiWild_foo*bar*baz")},
			{domain: "test-domain", entries: es("multiWild", "foobarbaz"), want: minute(10, "test-domain.multiWild_foo*bar*baz")},
			{domain: "test-domain", entries: es("multiWild", "foo123baz")},
			{domain: "test-domain", entries: es("multiWild", "bar456baz")},
		},
	},
	{
		name:   "TestDetailedMetric/nested_with_no_values_but_request_only_top-level_key",
		inline: []string{fill(detailedTwoLevels, "true", "false")}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key-1", "value-1"),
			want: &hit{rpu: 100, unit: config.UnitMinute, detailed: true, key: "nested.key-1_value-1"}}},
	},
	{
		name:   "TestDetailedMetric/nested_with_no_values_but_request_only_top-level_key_with_no_detailed_metric",
		inline: []string{fill(detailedTwoLevels, "false", "false")}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key-1", "value-1"), want: minute(100, "nested.key-1")}},
	},
	{
		name:   "TestDetailedMetric/nested_with_no_values_and_request_fully_nested_descriptors",
		inline: []string{fill(detailedTwoLevels, "true", "true")}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key-1", "value-1", "key-2", "value-2"),
			want: &hit{rpu: 5, unit: config.UnitMinute, detailed: true, key: "nested.key-1_value-1.key-2_value-2"}}},
	},
	{
		name:   "TestDetailedMetric/nested_with_no_values_and_request_fully_nested_descriptors_with_no_detailed_metric",
		inline: []string{fill(detailedTwoLevels, "false", "false")}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key-1", "value-1", "key-2", "value-2"),
			want: minute(5, "nested.key-1.key-2")}},
	},
	{
		name:   "TestDetailedMetric/test_nested_descriptors_with_simple_request",
		inline: []string{detailedRealistic}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key_1", "value-for-key-1"),
			want: &hit{rpu: 500, unit: config.UnitMinute, detailed: true, key: "nested.key_1_value-for-key-1"}}},
	},
	{
		name:   "TestDetailedMetric/test_nested_only_second_descriptor_request_not_nested",
		inline: []string{detailedRealistic}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key_2", "key-2-value"),
			want: &hit{rpu: 5000, unit: config.UnitMinute, detailed: true, key: "nested.key_2_key-2-value"}}},
	},
	{
		name:   "TestDetailedMetric/test_nested_descriptors_with_nested_request",
		inline: []string{detailedRealistic}, merge: true,
		lookups: []lookup{{domain: "nested", entries: es("key_2", "key-2-value", "key_3", "requested-key3-value"),
			want: &hit{rpu: 5, unit: config.UnitMinute, detailed: true, key: "nested.key_2_key-2-value.key_3_requested-key3-value"}}},
	},
	{
		name:   "TestValueToMetric_UsesRuntimeValuesInStats",
		inline: []string{fill(routeMethodSubject, "domain", "true", "true", "false")},
		lookups: []lookup{{domain: "domain", entries: es("route", "draw", "http_method", "GET", "subject_id", "123"),
			want: minute(60, "domain.route_draw.http_method_GET.subject_id")}},
	},
	{
		name: "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel",
		inline: []string{`
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
`},
		lookups: []lookup{{domain: "d", entries: es("k1", "A", "k2", "foo"),
			want: &hit{rpu: 1, unit: config.UnitSecond, key: "d.k1_A.k2"}}},
	},
	{
		name: "TestValueToMetric_MidLevelOnly",
		inline: []string{`
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
`},
		lookups: []lookup{{domain: "d", entries: es("k1", "X", "k2", "Y", "k3", "Z"),
			want: &hit{rpu: 1, unit: config.UnitSecond, key: "d.k1.k2_Y.k3"}}},
	},
	{
		name: "TestValueToMetric_NoFlag_Unchanged",
		inline: []string{`
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
`},
		lookups: []lookup{{domain: "d", entries: es("k1", "X", "k2", "Y"),
			want: &hit{rpu: 1, unit: config.UnitSecond, key: "d.k1.k2"}}},
	},
	{
		name:   "TestValueToMetric_DoesNotOverrideDetailedMetric",
		inline: []string{fill(routeMethodSubject, "domain", "true", "true", "true")},
		lookups: []lookup{{domain: "domain", entries: es("route", "draw", "http_method", "GET", "subject_id", "123"),
			want: &hit{rpu: 60, unit: config.UnitMinute, detailed: true, key: "domain.route_draw.http_method_GET.subject_id_123"}}},
	},
	{
		name: "TestValueToMetric_WithConfiguredValues",
		inline: []string{`
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
`},
		lookups: []lookup{
			{domain: "test-domain", entries: es("route", "api", "http_method", "GET", "subject_id", "user123"),
				want: minute(60, "test-domain.route_api.http_method_GET.subject_id")},
			{domain: "test-domain", entries: es("route", "api", "http_method", "POST", "subject_id", "user456"),
				want: minute(30, "test-domain.route_api.http_method_POST.subject_id")},
		},
	},
	{
		name: "TestValueToMetric_WithWildcard",
		inline: []string{`
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`},
		lookups: []lookup{
			{domain: "domain", entries: es("user", "alice", "action", "readfile", "resource", "documents"),
				want: minute(100, "domain.user_alice.action_readfile.resource")},
			{domain: "domain", entries: es("user", "bob", "action", "readdata", "resource", "database"),
				want: minute(100, "domain.user_bob.action_readdata.resource")},
		},
	},
	{
		name:   "TestValueToMetric_WithEmptyValue",
		inline: []string{fill(routeMethodSubject, "domain", "true", "true", "false")},
		lookups: []lookup{
			{domain: "domain", entries: es("route", "", "http_method", "GET", "subject_id", "123"),
				want: minute(60, "domain.route.http_method_GET.subject_id")},
			{domain: "domain", entries: es("route", "draw", "http_method", "", "subject_id", "123"),
				want: minute(60, "domain.route_draw.http_method.subject_id")},
			{domain: "domain", entries: es("route", "", "http_method", "", "subject_id", "123"),
				want: minute(60, "domain.route.http_method.subject_id")},
		},
	},
	{
		name: "TestValueToMetric_FullKeyMatchesStatsKey",
		inline: []string{
			fill(routeMethodSubject, "test-domain", "true", "true", "false"),
			fill(routeMethodSubject, "test-domain-2", "false", "false", "false"),
			fill(routeMethodSubject, "test-domain-3", "false", "false", "true"),
		},
		lookups: []lookup{
			{domain: "test-domain", entries: es("route", "api", "http_method", "GET", "subject_id", "user123"),
				want: minute(60, "test-domain.route_api.http_method_GET.subject_id")},
			{domain: "test-domain-2", entries: es("route", "api", "http_method", "GET", "subject_id", "user123"),
				want: minute(60, "test-domain-2.route.http_method.subject_id")},
			{domain: "test-domain-3", entries: es("route", "api", "http_method", "GET", "subject_id", "user123"),
				want: &hit{rpu: 60, unit: config.UnitMinute, detailed: true, key: "test-domain-3.route_api.http_method_GET.subject_id_user123"}},
		},
	},
	{
		name:  "TestShareThreshold",
		files: []string{"share_threshold.yaml"},
		lookups: []lookup{
			// Basic share_threshold.
			{domain: "test-domain", entries: es("files", "files/a.pdf"), want: minute(100, "test-domain.files_files/*").sharing("files/*")},
			{domain: "test-domain", entries: es("files", "files/b.csv"), want: minute(100, "test-domain.files_files/*").sharing("files/*")},
			{domain: "test-domain", entries: es("files", "files/c.txt"), want: minute(100, "test-domain.files_files/*").sharing("files/*")},
			// share_threshold with metrics.
			{domain: "test-domain", entries: es("route", "api/v1", "method", "GET"),
				want: minute(60, "test-domain.route_api/*.method").sharing("api/*", "")},
			{domain: "test-domain", entries: es("service", "svc/user", "endpoint", "get"),
				want: (&hit{rpu: 80, unit: config.UnitMinute, detailed: true, key: "test-domain.service_svc/*.endpoint_get"}).sharing("svc/*", "")},
			// Nested wildcards.
			{domain: "test-domain", entries: es("nested", "parent", "files", "nested/file1.txt"),
				want: minute(200, "test-domain.nested_parent.files_nested/*").sharing("", "nested/*")},
			{domain: "test-domain", entries: es("files", "top/file1.txt", "files", "nested/file1.txt"),
				want: minute(300, "test-domain.files_top/*.files_nested/*").sharing("top/*", "nested/*")},
			{domain: "test-domain", entries: es("path", "path/foo", "file", "file/doc1", "type", "pdf"),
				want: minute(120, "test-domain.path_path/*.file_file/*.type").sharing("path/*", "", "")},
			{domain: "test-domain", entries: es("user", "user/alice", "resource", "res/file1", "action", "read"),
				want: minute(150, "test-domain.user_user/*.resource_res/*.action").sharing("user/*", "res/*", "")},
			// Explicit value precedence over wildcard.
			{domain: "test-domain", entries: es("file", "test1"), want: minute(50, "test-domain.file_test1")},
			{domain: "test-domain", entries: es("file", "test2"), want: minute(100, "test-domain.file_test*").sharing("test*")},
			{domain: "test-domain", entries: es("file", "test23"), want: minute(100, "test-domain.file_test*").sharing("test*")},
			{domain: "test-domain", entries: es("file", "test123"), want: minute(100, "test-domain.file_test*").sharing("test*")},
			// Middle wildcard.
			{domain: "test-domain", entries: es("midpath", "/api/v1"), want: minute(100, "test-domain.midpath_/api*v1").sharing("/api*v1")},
			{domain: "test-domain", entries: es("midpath", "/api-beta-v1"), want: minute(100, "test-domain.midpath_/api*v1").sharing("/api*v1")},
			{domain: "test-domain", entries: es("midpath", "/apiXYZv1"), want: minute(100, "test-domain.midpath_/api*v1").sharing("/api*v1")},
			{domain: "test-domain", entries: es("midpath", "/api/v2")},
			// Multi-wildcard.
			{domain: "test-domain", entries: es("multiroute", "svcAepBrpc"), want: minute(50, "test-domain.multiroute_svc*ep*rpc").sharing("svc*ep*rpc")},
			{domain: "test-domain", entries: es("multiroute", "svcXXXepYYYrpc"), want: minute(50, "test-domain.multiroute_svc*ep*rpc").sharing("svc*ep*rpc")},
			{domain: "test-domain", entries: es("multiroute", "svceprpc"), want: minute(50, "test-domain.multiroute_svc*ep*rpc").sharing("svc*ep*rpc")},
			{domain: "test-domain", entries: es("multiroute", "svcABCrpc")},
			// share_threshold over value_to_metric, middle wildcard.
			{domain: "test-domain", entries: es("midroute", "/api/v2"), want: minute(80, "test-domain.midroute_/api*v2").sharing("/api*v2")},
			{domain: "test-domain", entries: es("midroute", "/api-beta-v2"), want: minute(80, "test-domain.midroute_/api*v2").sharing("/api*v2")},
			// Nested middle wildcards.
			{domain: "test-domain", entries: es("tenant", "t1prod", "resource", "resAv2"),
				want: minute(60, "test-domain.tenant_t*prod.resource_res*v2").sharing("t*prod", "res*v2")},
			{domain: "test-domain", entries: es("tenant", "t99prod", "resource", "resBBBv2"),
				want: minute(60, "test-domain.tenant_t*prod.resource_res*v2").sharing("t*prod", "res*v2")},
		},
	},
	{
		name:    "TestWildcardStatsBehavior/No_flags_-_preserves_original_behavior_with_wildcard_pattern",
		inline:  []string{fill(wildStats, "foo*", "false", "false")},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo1"), want: minute(20, "test-domain.wild_foo*")}},
	},
	{
		name:    "TestWildcardStatsBehavior/value_to_metric_-_uses_runtime_value",
		inline:  []string{fill(wildStats, "foo*", "false", "true")},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo1"), want: minute(20, "test-domain.wild_foo1")}},
	},
	{
		name:    "TestWildcardStatsBehavior/share_threshold_-_uses_wildcard_pattern_with_*",
		inline:  []string{fill(wildStats, "foo*", "true", "false")},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo1"), want: minute(20, "test-domain.wild_foo*").sharing("foo*")}},
	},
	{
		name:    "TestWildcardStatsBehavior/share_threshold_with_value_to_metric_-_share_threshold_takes_priority",
		inline:  []string{fill(wildStats, "foo*", "true", "true")},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo1"), want: minute(20, "test-domain.wild_foo*").sharing("foo*")}},
	},
	{
		name: "TestWildcardStatsBehavior/value_to_metric_in_other_descriptor_-_wildcard_pattern_preserved",
		inline: []string{`
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
`},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo1", "other", "bar", "limit", "X"),
			want: minute(20, "test-domain.wild_foo*.other_bar.limit")}},
	},
	{
		name:   "TestWildcardStatsBehavior/middle+trailing_wildcard_-_no_flags_-_preserves_wildcard_pattern_in_stats_key",
		inline: []string{fill(wildStats, "foo*bar*", "false", "false")},
		lookups: []lookup{
			{domain: "test-domain", entries: es("wild", "foo123bar456"), want: minute(20, "test-domain.wild_foo*bar*")},
			{domain: "test-domain", entries: es("wild", "fooXbarY"), want: minute(20, "test-domain.wild_foo*bar*")},
		},
	},
	{
		name:    "TestWildcardStatsBehavior/middle+trailing_wildcard_-_value_to_metric_-_uses_runtime_value",
		inline:  []string{fill(wildStats, "foo*bar*", "false", "true")},
		lookups: []lookup{{domain: "test-domain", entries: es("wild", "foo123bar456"), want: minute(20, "test-domain.wild_foo123bar456")}},
	},
	{
		name:  "TestMetadata",
		files: []string{"metadata.yaml"},
		lookups: []lookup{
			{domain: "test-domain"},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "something"),
				want: &hit{rpu: 5, unit: config.UnitSecond, key: "test-domain.key1_value1.subkey1",
					metadata: map[string]any{"name": "service_1"}}},
			{domain: "test-domain", entries: es("key1", "value1", "subkey1", "subvalue1"),
				want: &hit{rpu: 10, unit: config.UnitSecond, key: "test-domain.key1_value1.subkey1_subvalue1"}},
			{domain: "test-domain", entries: es("key2", "something"),
				want: &hit{rpu: 20, unit: config.UnitMinute, key: "test-domain.key2",
					metadata: map[string]any{"service_with_quota": map[string]any{
						"name": "service_2", "tiers": []any{1, 2.5, true, nil}}}}},
		},
	},
}

// TestOriginalCases loads each configuration of the original's tests and
// checks the outcome the original asserts.
func TestOriginalCases(t *testing.T) {
	for _, c := range originalCases {
		t.Run(c.name, func(t *testing.T) {
			var files []config.File
			for _, name := range c.files {
				data, err := os.ReadFile(filepath.Join("testdata", name))
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, config.File{Name: name, Data: data})
			}
			for _, y := range c.inline {
				files = append(files, config.File{Name: "inline", Data: []byte(y)})
			}
			rules, err := config.Load(files, config.Options{MergeDomains: c.merge})
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("Load error = %v, want %v", err, c.wantErr)
				}
				var ce *config.Error
				if !errors.As(err, &ce) {
					t.Fatalf("Load error %T is not a *config.Error", err)
				}
				if err.Error() != c.wantMsg {
					t.Errorf("Load error:\n got %s\nwant %s", err, c.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			for i, l := range c.lookups {
				checkLookup(t, rules, i, l)
			}
		})
	}
}
