package policy_test

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/policy"
)

// plan1 is a document with one plan "free" of the given rules.
func plan1(rules ...string) string {
	return `{"plans": [{"name": "free", "rules": [` + strings.Join(rules, ",\n") + `]}]}`
}

// ok is a valid rule; rule returns it with fields replaced or added.
const ok = `{"name": "r", "tier": "user", "rate": 10, "burst": 20}`

// problems splits a Load error into its problems.
func problems(t *testing.T, err error) []*policy.Error {
	t.Helper()
	if err == nil {
		return nil
	}
	if !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []*policy.Error
	for _, e := range errs {
		pe, ok := e.(*policy.Error)
		if !ok {
			t.Fatalf("problem %v is a %T, want *policy.Error", e, e)
		}
		out = append(out, pe)
	}
	return out
}

// TestLoadErrors: every kind of bad document is reported with a message
// that names the plan, the rule and the field, and with where it is.
func TestLoadErrors(t *testing.T) {
	type want struct {
		msg        string // the whole message, after "policy: "
		path       string
		plan, rule string
	}
	tests := []struct {
		name string
		doc  string
		want []want
	}{
		// The document.
		{"empty", ``, []want{{msg: "line 1, column 1: invalid JSON: the document is empty"}}},
		{"syntax", "{\"plans\": [\n  {\"name\": \"free\",}\n]}", []want{{msg: "line 2, column 19: invalid JSON: invalid character '}' looking for beginning of object key string"}}},
		{"truncated", `{"plans": [`, []want{{msg: "line 1, column 12: invalid JSON: the document ends too early"}}},
		{"trailing data", `{"plans": []} {}`, []want{{msg: "line 1, column 15: invalid JSON: more data after the document"}}},
		{"not an object", `[]`, []want{{msg: "line 1, column 1: want an object, got an array"}}},
		{"unknown field", `{"plans": [{"name": "free"}], "plan": 1}`, []want{{msg: `line 1, column 31: plan: unknown field (did you mean "plans"?)`, path: "plan"}}},
		{"unknown field far from any", `{"plans": [{"name": "free"}], "limits": 1}`, []want{{msg: `line 1, column 31: limits: unknown field (want plans, shared_rules, default_plan, comment)`, path: "limits"}}},
		{"repeated field", "{\"plans\": [{\"name\": \"free\"}],\n \"plans\": []}", []want{{msg: `line 2, column 2: plans: repeated (first on line 1)`, path: "plans"}}},
		{"no plans", `{}`, []want{{msg: "line 1, column 1: plans: missing: a document needs at least one plan", path: "plans"}}},
		{"plans empty", `{"plans": []}`, []want{{msg: "line 1, column 11: plans: empty: a document needs at least one plan", path: "plans"}}},
		{"plans not an array", `{"plans": {"free": {}}}`, []want{{msg: "line 1, column 11: plans: want an array of plans, got an object", path: "plans"}}},
		{"comment not a string", `{"comment": 1, "plans": [{"name": "free"}]}`, []want{{msg: "line 1, column 13: comment: want a string, got the number 1", path: "comment"}}},
		{"default plan unknown", `{"default_plan": "gold", "plans": [{"name": "free"}]}`, []want{{msg: `line 1, column 18: default_plan: unknown plan "gold"`, path: "default_plan"}}},

		// Plans.
		{"plan not an object", `{"plans": ["free"]}`, []want{{msg: `line 1, column 12: plan #1: want an object, got a string "free"`, path: "plans[0]"}}},
		{"plan without name", `{"plans": [{"rules": []}]}`, []want{{msg: `line 1, column 12: plan #1: name: missing`, path: "plans[0].name"}}},
		{"plan name invalid", `{"plans": [{"name": "free plan"}]}`, []want{{msg: `line 1, column 21: plan #1: name: "free plan" has ' ': a name is letters, digits, '_', '-' and '.'`, path: "plans[0].name"}}},
		{"plan name empty", `{"plans": [{"name": ""}]}`, []want{{msg: `line 1, column 21: plan #1: name: empty`, path: "plans[0].name"}}},
		{"plan name too long", `{"plans": [{"name": "` + strings.Repeat("p", 65) + `"}]}`, []want{{msg: `line 1, column 21: plan #1: name: "` + strings.Repeat("p", 65) + `" is 65 bytes long, more than 64`, path: "plans[0].name"}}},
		{"plan name not a string", `{"plans": [{"name": 7}]}`, []want{{msg: `line 1, column 21: plan #1: name: want a string, got the number 7`, path: "plans[0].name"}}},
		{"plan declared twice", `{"plans": [{"name": "free"}, {"name": "free"}]}`, []want{{msg: `line 1, column 39: plan "free": name: plan "free" is declared twice (first at plans[0])`, path: "plans[1].name", plan: "free"}}},
		{"plan unknown field", `{"plans": [{"name": "free", "rule": []}]}`, []want{{msg: `line 1, column 29: plan "free": rule: unknown field (did you mean "rules"?)`, path: "plans[0].rule", plan: "free"}}},
		{"rules not an array", `{"plans": [{"name": "free", "rules": {}}]}`, []want{{msg: `line 1, column 38: plan "free": rules: want an array of rules, got an object`, path: "plans[0].rules", plan: "free"}}},
		{"extends unknown", `{"plans": [{"name": "pro", "extends": "fre"}]}`, []want{{msg: `line 1, column 39: plan "pro": extends: unknown plan "fre"`, path: "plans[0].extends", plan: "pro"}}},
		{"extends empty", `{"plans": [{"name": "pro", "extends": ""}]}`, []want{{msg: `line 1, column 39: plan "pro": extends: empty (leave the field out for a plan that extends none)`, path: "plans[0].extends", plan: "pro"}}},
		{"extends itself", `{"plans": [{"name": "pro", "extends": "pro"}]}`, []want{{msg: `line 1, column 39: plan "pro": extends: cycle: pro -> pro`, path: "plans[0].extends", plan: "pro"}}},
		{"extends cycle", "{\"plans\": [\n{\"name\": \"a\", \"extends\": \"c\"},\n{\"name\": \"b\", \"extends\": \"a\"},\n{\"name\": \"c\", \"extends\": \"b\"},\n{\"name\": \"d\", \"extends\": \"c\"}]}",
			[]want{{msg: `line 3, column 26: plan "b": extends: cycle: a -> c -> b -> a`, path: "plans[1].extends", plan: "b"}}},

		// Rules.
		{"rule not an object", plan1(`[]`), []want{{msg: `line 1, column 39: plan "free" rule #1: want an object, got an array`, path: "plans[0].rules[0]", plan: "free"}}},
		{"rule without name", plan1(`{"tier": "user", "rate": 1, "burst": 1}`), []want{{msg: `line 1, column 39: plan "free" rule #1: name: missing`, path: "plans[0].rules[0].name", plan: "free"}}},
		{"rule name invalid", plan1(`{"name": "a|b", "tier": "user", "rate": 1, "burst": 1}`), []want{{msg: `line 1, column 48: plan "free" rule #1: name: "a|b" has '|': a name is letters, digits, '_', '-' and '.'`, path: "plans[0].rules[0].name", plan: "free"}}},
		{"rule names twice", plan1(ok, ok), []want{{msg: `line 2, column 10: plan "free" rule "r": name: "r" is also the name of the rule at plans[0].rules[0]`, path: "plans[0].rules[1].name", plan: "free", rule: "r"}}},
		{"rule named as a shared rule", `{"shared_rules": [` + ok + `], "plans": [{"name": "free", "rules": [` + ok + `]}]}`,
			[]want{{msg: `line 1, column 122: plan "free" rule "r": name: "r" is also the name of the shared rule at shared_rules[0]`, path: "plans[0].rules[0].name", plan: "free", rule: "r"}}},
		{"shared rules named twice", `{"shared_rules": [` + ok + `, ` + ok + `], "plans": [{"name": "free"}]}`,
			[]want{{msg: `line 1, column 84: shared rule "r": name: "r" is also the name of the shared rule at shared_rules[0]`, path: "shared_rules[1].name", rule: "r"}}},
		{"rule unknown field", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 20, "burts": 20}`), []want{{msg: `line 1, column 94: plan "free" rule "r": burts: unknown field (did you mean "burst"?)`, path: "plans[0].rules[0].burts", plan: "free", rule: "r"}}},
		{"rule unknown field, case", plan1(`{"name": "r", "tier": "user", "rate": 10, "Burst": 20}`), []want{
			{msg: `line 1, column 39: plan "free" rule "r": burst: missing (the bucket's capacity, in tokens)`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"},
			{msg: `line 1, column 81: plan "free" rule "r": Burst: unknown field (did you mean "burst"?)`, path: "plans[0].rules[0].Burst", plan: "free", rule: "r"},
		}},
		{"rule repeated field", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 20, "rate": 30}`), []want{{msg: `line 1, column 94: plan "free" rule "r": rate: repeated (first on line 1)`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"tier missing", plan1(`{"name": "r", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 39: plan "free" rule "r": tier: missing (want user, api_key, ip, endpoint, global or header:NAME)`, path: "plans[0].rules[0].tier", plan: "free", rule: "r"}}},
		{"tier unknown", plan1(`{"name": "r", "tier": "tenant", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 61: plan "free" rule "r": tier: "tenant" is not user, api_key, ip, endpoint, global or header:NAME`, path: "plans[0].rules[0].tier", plan: "free", rule: "r"}}},
		{"tier header empty", plan1(`{"name": "r", "tier": "header:", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 61: plan "free" rule "r": tier: "header:": a header name is 1 to 64 bytes`, path: "plans[0].rules[0].tier", plan: "free", rule: "r"}}},
		{"tier header invalid", plan1(`{"name": "r", "tier": "header:X Tenant", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 61: plan "free" rule "r": tier: "header:X Tenant": "X Tenant" is not a valid header name`, path: "plans[0].rules[0].tier", plan: "free", rule: "r"}}},
		{"tier endpoint without route", plan1(`{"name": "r", "tier": "endpoint", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 61: plan "free" rule "r": tier: the endpoint tier needs a route: its bucket is the route's`, path: "plans[0].rules[0].tier", plan: "free", rule: "r"}}},
		{"route empty", plan1(`{"name": "r", "tier": "user", "route": "", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 78: plan "free" rule "r": route: empty (leave the field out for a rule that applies to every request)`, path: "plans[0].rules[0].route", plan: "free", rule: "r"}}},
		{"route invalid", plan1(`{"name": "r", "tier": "user", "route": "GET /reports/{id", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 78: plan "free" rule "r": route: invalid pattern: parsing "GET /reports/{id": at offset 13: bad wildcard segment (must end with '}')`, path: "plans[0].rules[0].route", plan: "free", rule: "r"}}},
		{"route without slash", plan1(`{"name": "r", "tier": "user", "route": "GET reports", "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 78: plan "free" rule "r": route: invalid pattern: parsing "GET reports": at offset 4: host/path missing /`, path: "plans[0].rules[0].route", plan: "free", rule: "r"}}},
		{"route not a string", plan1(`{"name": "r", "tier": "user", "route": ["/a"], "rate": 10, "burst": 20}`), []want{{msg: `line 1, column 78: plan "free" rule "r": route: want a string, got an array`, path: "plans[0].rules[0].route", plan: "free", rule: "r"}}},
		{"routes conflict", plan1(
			`{"name": "a", "tier": "user", "route": "GET /items/{id}", "rate": 10, "burst": 20}`,
			`{"name": "b", "tier": "user", "route": "/items/new/{x}", "rate": 10, "burst": 20}`,
			`{"name": "c", "tier": "user", "route": "GET /{kind}/new", "rate": 10, "burst": 20}`),
			[]want{{msg: `line 3, column 40: plan "free" rule "c": route: "GET /{kind}/new" conflicts with the route "GET /items/{id}" of rule "a": GET /{kind}/new and GET /items/{id} both match some paths, like "/items/new". But neither is more specific than the other. GET /{kind}/new matches "/kind/new", but GET /items/{id} doesn't. GET /items/{id} matches "/items/id", but GET /{kind}/new doesn't.`, path: "plans[0].rules[2].route", plan: "free", rule: "c"}}},
		{"route conflicts with an inherited one", `{"plans": [
{"name": "free", "rules": [{"name": "a", "tier": "user", "route": "GET /items/{id}", "rate": 10, "burst": 20}]},
{"name": "pro", "extends": "free", "rules": [{"name": "b", "tier": "user", "route": "GET /items/{name}", "rate": 10, "burst": 20}]}]}`,
			[]want{{msg: `line 3, column 85: plan "pro" rule "b": route: "GET /items/{name}" conflicts with the route "GET /items/{id}" of rule "a" (inherited from plan "free"): GET /items/{name} matches the same requests as GET /items/{id}`, path: "plans[1].rules[0].route", plan: "pro", rule: "b"}}},
		{"rate missing", plan1(`{"name": "r", "tier": "user", "burst": 20}`), []want{{msg: `line 1, column 39: plan "free" rule "r": rate: missing (tokens per second, or a string such as "100/min")`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate 0", plan1(`{"name": "r", "tier": "user", "rate": 0, "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: 0 is 0 tokens/s, outside [1e-06, 1e+09]`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate negative", plan1(`{"name": "r", "tier": "user", "rate": -1, "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: -1 is -1 tokens/s, outside [1e-06, 1e+09]`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate above 1e9", plan1(`{"name": "r", "tier": "user", "rate": "2e9/s", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "2e9/s" is 2e+09 tokens/s, outside [1e-06, 1e+09]`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate below 1e-6", plan1(`{"name": "r", "tier": "user", "rate": "1/30d", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "1/30d": the period "30d" is not a unit (s, m, h, d) or a duration such as 10s`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate below 1e-6 as duration", plan1(`{"name": "r", "tier": "user", "rate": "1/720h", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "1/720h" is 3.85802e-07 tokens/s, outside [1e-06, 1e+09]`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate without period", plan1(`{"name": "r", "tier": "user", "rate": "100", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "100" is not COUNT/PERIOD (such as "100/min") or a number of tokens per second`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate count invalid", plan1(`{"name": "r", "tier": "user", "rate": "many/min", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "many/min": the count "many" is not a positive number`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate count 0", plan1(`{"name": "r", "tier": "user", "rate": "0/min", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "0/min": the count "0" is not a positive number`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate period negative", plan1(`{"name": "r", "tier": "user", "rate": "1/-1s", "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: "1/-1s": the period "-1s" is not positive`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"rate a boolean", plan1(`{"name": "r", "tier": "user", "rate": true, "burst": 20}`), []want{{msg: `line 1, column 77: plan "free" rule "r": rate: want a number of tokens per second or a string such as "100/min", got a boolean`, path: "plans[0].rules[0].rate", plan: "free", rule: "r"}}},
		{"burst missing", plan1(`{"name": "r", "tier": "user", "rate": 10}`), []want{{msg: `line 1, column 39: plan "free" rule "r": burst: missing (the bucket's capacity, in tokens)`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"}}},
		{"burst 0", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 0}`), []want{{msg: `line 1, column 90: plan "free" rule "r": burst: 0 is outside [1, 1000000000]`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"}}},
		{"burst above 1e9", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 2e9}`), []want{{msg: `line 1, column 90: plan "free" rule "r": burst: 2000000000 is outside [1, 1000000000]`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"}}},
		{"burst fractional", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 1.5}`), []want{{msg: `line 1, column 90: plan "free" rule "r": burst: want an integer, got the number 1.5`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"}}},
		{"burst a string", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": "20"}`), []want{{msg: `line 1, column 90: plan "free" rule "r": burst: want an integer, got a string "20"`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"}}},
		{"cost 0", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 20, "cost": 0}`), []want{{msg: `line 1, column 102: plan "free" rule "r": cost: 0 is less than 1`, path: "plans[0].rules[0].cost", plan: "free", rule: "r"}}},
		{"cost above burst", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 20, "cost": 21}`), []want{{msg: `line 1, column 102: plan "free" rule "r": cost: 21 is more than the burst 20: no request could ever pass`, path: "plans[0].rules[0].cost", plan: "free", rule: "r"}}},
		{"cost and burst bad", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 0, "cost": 0}`), []want{
			{msg: `line 1, column 90: plan "free" rule "r": burst: 0 is outside [1, 1000000000]`, path: "plans[0].rules[0].burst", plan: "free", rule: "r"},
			{msg: `line 1, column 101: plan "free" rule "r": cost: 0 is less than 1`, path: "plans[0].rules[0].cost", plan: "free", rule: "r"},
		}},
		{"mode unknown", plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 20, "mode": "fast"}`), []want{{msg: `line 1, column 102: plan "free" rule "r": mode: "fast" is not lease, optimistic or exact`, path: "plans[0].rules[0].mode", plan: "free", rule: "r"}}},
		{"shared rule bad", `{"shared_rules": [{"name": "g", "tier": "global", "rate": 10, "burst": 20, "cost": 30}], "plans": [{"name": "free"}]}`,
			[]want{{msg: `line 1, column 84: shared rule "g": cost: 30 is more than the burst 20: no request could ever pass`, path: "shared_rules[0].cost", rule: "g"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules, err := policy.Load(strings.NewReader(tt.doc))
			if err == nil {
				t.Fatalf("Load = %v, nil; want %d problems", rules, len(tt.want))
			}
			if rules != nil {
				t.Errorf("Load returned rules %v with the error", rules)
			}
			got := problems(t, err)
			if len(got) != len(tt.want) {
				t.Fatalf("Load: %d problems, want %d:\n%v", len(got), len(tt.want), err)
			}
			for i, w := range tt.want {
				g := got[i]
				if msg := "policy: " + w.msg; g.Error() != msg {
					t.Errorf("problem %d:\n got %s\nwant %s", i, g.Error(), msg)
				}
				if g.Path != w.path || g.Plan != w.plan || g.Rule != w.rule {
					t.Errorf("problem %d: Path, Plan, Rule = %q, %q, %q; want %q, %q, %q", i, g.Path, g.Plan, g.Rule, w.path, w.plan, w.rule)
				}
			}
		})
	}
}

// TestLoadAllProblems: the problems of every plan and rule are reported at
// once, in the order of the document.
func TestLoadAllProblems(t *testing.T) {
	doc := `{
  "default_plan": "gold",
  "shared_rules": [{"name": "g", "tier": "global", "rate": 0, "burst": 1}],
  "plans": [
    {"name": "free", "rules": [
      {"name": "a", "tier": "user", "rate": 10, "burst": 0},
      {"name": "b", "tier": "ipv4", "rate": 10, "burst": 5}
    ]},
    {"name": "pro", "extends": "gold", "rules": [
      {"name": "c", "tier": "user", "rate": 10, "burst": 5, "mode": "strict"}
    ]}
  ]
}`
	_, err := policy.Load(strings.NewReader(doc))
	got := problems(t, err)
	want := []struct {
		line int
		path string
	}{
		{2, "default_plan"},
		{3, "shared_rules[0].rate"},
		{6, "plans[0].rules[0].burst"},
		{7, "plans[0].rules[1].tier"},
		{9, "plans[1].extends"},
		{10, "plans[1].rules[0].mode"},
	}
	if len(got) != len(want) {
		t.Fatalf("Load: %d problems, want %d:\n%v", len(got), len(want), err)
	}
	for i, w := range want {
		if got[i].Line != w.line || got[i].Path != w.path {
			t.Errorf("problem %d at line %d, %s; want line %d, %s (%v)", i, got[i].Line, got[i].Path, w.line, w.path, got[i])
		}
	}
}

// TestLoadFile: the problems name the file; a file that cannot be read is
// an error wrapping the file system's.
func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.json")
	if err := os.WriteFile(path, []byte(plan1(`{"name": "r", "tier": "user", "rate": 10, "burst": 0}`)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := policy.LoadFile(path)
	want := "policy: " + path + `:1:90: plan "free" rule "r": burst: 0 is outside [1, 1000000000]`
	if err == nil || err.Error() != want {
		t.Errorf("LoadFile = %v, want %s", err, want)
	}
	var pe *policy.Error
	if !errors.As(err, &pe) || pe.File != path || pe.Line != 1 || pe.Column != 90 {
		t.Errorf("LoadFile error = %#v, want an *Error at %s:1:90", pe, path)
	}
	_, err = policy.LoadFile(filepath.Join(dir, "missing.json"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, policy.ErrInvalid) {
		t.Errorf("LoadFile(missing) = %v, want an error wrapping fs.ErrNotExist", err)
	}
}

// TestLoadRules: the values of valid rules, with their defaults, and the
// inheritance of plans.
func TestLoadRules(t *testing.T) {
	rules, err := policy.LoadFile("testdata/plans.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(rules.Plans(), " "), "free pro enterprise"; got != want {
		t.Errorf("Plans() = %s, want %s", got, want)
	}
	lease := func(rate float64, burst int64) hybrid.Limit { return hybrid.Limit{Rate: rate, Burst: burst} }
	free := []policy.Rule{
		{Name: "per-user", Plan: "free", Tier: "user", Limit: lease(1, 30), Cost: 1},
		{Name: "per-key", Plan: "free", Tier: "api_key", Limit: lease(2, 60), Cost: 1},
		{Name: "items", Plan: "free", Tier: "user", Route: "GET /v1/items/{id}", Limit: lease(10, 20), Cost: 1},
		{Name: "reports", Plan: "free", Tier: "user", Route: "GET /v1/reports/{id}", Limit: lease(10.0/60, 20), Cost: 10},
		{Name: "reports-endpoint", Plan: "free", Tier: "endpoint", Route: "GET /v1/reports/{id}", Limit: lease(100.0/60, 100), Cost: 10},
		{Name: "plan-pool", Plan: "free", Tier: "global", Limit: lease(500, 1000), Cost: 1},
	}
	// pro overrides every rule of free but items, in place.
	pro := []policy.Rule{
		{Name: "per-user", Plan: "pro", Tier: "user", Limit: lease(10, 300), Cost: 1},
		{Name: "per-key", Plan: "pro", Tier: "api_key", Limit: lease(20, 600), Cost: 1},
		free[2],
		{Name: "reports", Plan: "pro", Tier: "user", Route: "GET /v1/reports/{id}", Limit: lease(100.0/60, 200), Cost: 10},
		{Name: "reports-endpoint", Plan: "pro", Tier: "endpoint", Route: "GET /v1/reports/{id}", Limit: lease(1000.0/60, 1000), Cost: 10},
		{Name: "plan-pool", Plan: "pro", Tier: "global", Limit: lease(5000, 10000), Cost: 1},
	}
	enterprise := append([]policy.Rule{
		{Name: "per-user", Plan: "enterprise", Tier: "user", Limit: hybrid.Limit{Rate: 100, Burst: 1000, Mode: hybrid.Optimistic}, Cost: 1},
	}, pro[1:]...)
	enterprise = append(enterprise,
		policy.Rule{Name: "per-tenant", Plan: "enterprise", Tier: "header:X-Tenant-Id", Limit: lease(500, 5000), Cost: 1},
		policy.Rule{Name: "exports", Plan: "enterprise", Tier: "header:X-Tenant-Id", Route: "POST /v1/exports/", Limit: lease(1.0/60, 3), Cost: 1},
	)
	shared := []policy.Rule{
		{Name: "per-ip", Tier: "ip", Limit: lease(20, 100), Cost: 1},
		{Name: "login", Tier: "ip", Route: "POST /v1/login", Limit: hybrid.Limit{Rate: 5.0 / 60, Burst: 5, Mode: hybrid.Exact}, Cost: 1},
		{Name: "service", Tier: "global", Limit: hybrid.Limit{Rate: 20000, Burst: 40000, Mode: hybrid.Optimistic}, Cost: 1},
	}
	for _, tt := range []struct {
		plan string
		want []policy.Rule
	}{{"free", free}, {"pro", pro}, {"enterprise", enterprise}} {
		got, ok := rules.Plan(tt.plan)
		if !ok {
			t.Fatalf("Plan(%q) not found", tt.plan)
		}
		sameRules(t, "Plan("+tt.plan+")", got, tt.want)
	}
	sameRules(t, "Shared()", rules.Shared(), shared)
	if got, ok := rules.Plan("gold"); ok || got != nil {
		t.Errorf("Plan(gold) = %v, %v; want nil, false", got, ok)
	}
}

func sameRules(t *testing.T, what string, got, want []policy.Rule) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rules, want %d: %+v", what, len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if math.Abs(g.Limit.Rate-w.Limit.Rate) > 1e-12*w.Limit.Rate {
			t.Errorf("%s rule %d: rate %v, want %v", what, i, g.Limit.Rate, w.Limit.Rate)
		}
		g.Limit.Rate = w.Limit.Rate
		if g != w {
			t.Errorf("%s rule %d:\n got %+v\nwant %+v", what, i, g, w)
		}
	}
}

// TestRates: the forms of a rate.
func TestRates(t *testing.T) {
	tests := []struct {
		rate string // JSON
		want float64
	}{
		{`10`, 10},
		{`0.5`, 0.5},
		{`1e-6`, 1e-6},
		{`1e9`, 1e9},
		{`"10/s"`, 10},
		{`"10/sec"`, 10},
		{`"10/second"`, 10},
		{`"100/m"`, 100.0 / 60},
		{`"100/min"`, 100.0 / 60},
		{`"100/minute"`, 100.0 / 60},
		{`"3600/h"`, 1},
		{`"3600/hour"`, 1},
		{`"86400/d"`, 1},
		{`"1/day"`, 1.0 / 86400},
		{`"3/10s"`, 0.3},
		{`"1.5/500ms"`, 3},
		{`"90/1m30s"`, 1},
		{`" 5 / min "`, 5.0 / 60},
		{`"1e3/s"`, 1000},
	}
	for _, tt := range tests {
		rules, err := policy.Load(strings.NewReader(plan1(`{"name": "r", "tier": "global", "rate": ` + tt.rate + `, "burst": 1}`)))
		if err != nil {
			t.Errorf("rate %s: %v", tt.rate, err)
			continue
		}
		got, _ := rules.Plan("free")
		if r := got[0].Limit.Rate; math.Abs(r-tt.want) > 1e-12*tt.want {
			t.Errorf("rate %s = %v tokens/s, want %v", tt.rate, r, tt.want)
		}
	}
}

// TestModesAndDefaults: mode names, the default mode and cost, integer
// forms of burst and cost, comments.
func TestModesAndDefaults(t *testing.T) {
	rules, err := policy.Load(strings.NewReader(`{"comment": "c", "plans": [{"name": "free", "comment": "c", "rules": [
		{"name": "a", "tier": "user", "rate": 1, "burst": 1e3, "comment": "c"},
		{"name": "b", "tier": "user", "rate": 1, "burst": 10, "cost": 2.0, "mode": "lease"},
		{"name": "c", "tier": "user", "rate": 1, "burst": 10, "mode": "optimistic"},
		{"name": "d", "tier": "user", "rate": 1, "burst": 10, "mode": "exact"},
		{"name": "e", "tier": "header:x-tenant-id", "rate": 1, "burst": 10}
	]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := rules.Plan("free")
	want := []struct {
		mode  hybrid.Mode
		burst int64
		cost  int64
		tier  string
	}{
		{hybrid.Lease, 1000, 1, "user"},
		{hybrid.Lease, 10, 2, "user"},
		{hybrid.Optimistic, 10, 1, "user"},
		{hybrid.Exact, 10, 1, "user"},
		{hybrid.Lease, 10, 1, "header:X-Tenant-Id"},
	}
	for i, w := range want {
		g := got[i]
		if g.Limit.Mode != w.mode || g.Limit.Burst != w.burst || g.Cost != w.cost || g.Tier != w.tier {
			t.Errorf("rule %s: mode %v burst %d cost %d tier %s; want %v %d %d %s", g.Name, g.Limit.Mode, g.Limit.Burst, g.Cost, g.Tier, w.mode, w.burst, w.cost, w.tier)
		}
	}
}

// TestRouting121: with the routing of Go 1.21 (GODEBUG httpmuxgo121=1,
// read when the program starts), a rule with a route is an error rather
// than a pattern silently matched otherwise. The test runs itself again
// with that setting.
func TestRouting121(t *testing.T) {
	if os.Getenv("POLICY_TEST_ROUTING121") == "1" {
		_, err := policy.Load(strings.NewReader(plan1(`{"name": "r", "tier": "user", "route": "GET /items/{id}", "rate": 1, "burst": 1}`)))
		want := `policy: line 1, column 78: plan "free" rule "r": route: ServeMux has the routing of Go 1.21 (GODEBUG httpmuxgo121=1), without methods or wildcards: rules with routes need the routing of Go 1.22`
		if err == nil || err.Error() != want {
			t.Errorf("Load = %v, want %s", err, want)
		}
		if _, err := policy.Load(strings.NewReader(plan1(ok))); err != nil {
			t.Errorf("Load of a rule without a route: %v", err)
		}
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestRouting121$", "-test.count=1")
	cmd.Env = append(os.Environ(), "POLICY_TEST_ROUTING121=1", "GODEBUG=httpmuxgo121=1")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "PASS") {
		t.Errorf("the test with GODEBUG=httpmuxgo121=1: %v\n%s", err, out)
	}
}
