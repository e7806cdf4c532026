package policy

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/limit"
)

// Load reads a JSON document of plans and rules from r, validates all of it
// and returns the rules ready for Checks. The error, if any, joins (with
// errors.Join) an *Error for every problem found. docs/policy.md describes
// the format.
func Load(r io.Reader) (*Rules, error) {
	doc, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("policy: read: %w", err)
	}
	return load(doc, "")
}

// LoadFile is Load of the file at path; its errors name the file.
func LoadFile(path string) (*Rules, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return load(doc, path)
}

// Bounds of names.
const (
	maxNameLen   = 64 // plan and rule names
	maxHeaderLen = 64 // header names in the tier "header:NAME"
)

// The fields of each object of the document.
var (
	docFields  = []string{"plans", "shared_rules", "default_plan", "comment"}
	planFields = []string{"name", "extends", "rules", "comment"}
	ruleFields = []string{"name", "tier", "route", "rate", "burst", "cost", "mode", "comment"}
)

// scope is the object that problems are reported in.
type scope struct {
	path       string // JSON path of the object
	plan, rule string // names, for Error
	where      string // for the message
}

// at returns the JSON path of field name of s.
func (s scope) at(name string) string {
	if s.path == "" {
		return name
	}
	return s.path + "." + name
}

// loader collects the problems of one document.
type loader struct {
	doc  []byte
	file string
	errs []error
}

// fail records a problem at offset off (-1: nowhere in particular) of the
// value at path, in s.
func (ld *loader) fail(s scope, path string, off int64, err error) {
	e := &Error{File: ld.file, Path: path, Plan: s.plan, Rule: s.rule, Err: err, where: s.where}
	if off >= 0 && off <= int64(len(ld.doc)) {
		before := ld.doc[:off]
		e.Line = bytes.Count(before, []byte("\n")) + 1
		e.Column = int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	}
	ld.errs = append(ld.errs, e)
}

// failf is fail with a formatted message, for field name of s.
func (ld *loader) failf(s scope, name string, off int64, format string, args ...any) {
	ld.fail(s, s.at(name), off, fmt.Errorf(format, args...))
}

// object returns the members of v, reporting v if it is not an object.
func (ld *loader) object(s scope, v value) ([]member, bool) {
	ms, ok := v.object()
	if !ok {
		ld.fail(s, s.path, v.off, fmt.Errorf("want an object, got %s", v.kind()))
	}
	return ms, ok
}

// fields returns the known fields of an object's members ms, reporting
// every unknown or repeated field.
func (ld *loader) fields(s scope, ms []member, known []string) map[string]value {
	fs := make(map[string]value, len(ms))
	first := map[string]int64{}
	for _, m := range ms {
		if at, dup := first[m.key]; dup {
			line := bytes.Count(ld.doc[:at], []byte("\n")) + 1
			ld.failf(s, m.key, m.keyOff, "repeated (first on line %d)", line)
			continue
		}
		first[m.key] = m.keyOff
		if !slices.Contains(known, m.key) {
			ld.failf(s, m.key, m.keyOff, "unknown field%s", suggest(m.key, known))
			continue
		}
		fs[m.key] = m.val
	}
	return fs
}

// str returns the string field name of fs, reporting a value of another
// type. present is false if the field is absent.
func (ld *loader) str(s scope, fs map[string]value, name string) (v string, present, ok bool) {
	f, present := fs[name]
	if !present {
		return "", false, true
	}
	v, ok = f.str()
	if !ok {
		ld.failf(s, name, f.off, "want a string, got %s", f.kind())
	}
	return v, true, ok
}

// name returns the valid name in the first field "name" of the members ms
// of the object v, and where it is, reporting a missing or invalid one.
func (ld *loader) name(s scope, ms []member, v value) (string, int64, bool) {
	i := slices.IndexFunc(ms, func(m member) bool { return m.key == "name" })
	if i < 0 {
		ld.failf(s, "name", v.off, "missing")
		return "", 0, false
	}
	f := ms[i].val
	n, ok := f.str()
	if !ok {
		ld.failf(s, "name", f.off, "want a string, got %s", f.kind())
		return "", 0, false
	}
	if err := checkName(n); err != nil {
		ld.fail(s, s.at("name"), f.off, err)
		return "", 0, false
	}
	return n, f.off, true
}

// ruleSrc is a rule as read from the document.
type ruleSrc struct {
	Rule
	kind   tierKind
	header string // canonical, for tierHeader
	ok     bool   // every field is valid
	named  bool   // the name is valid
	s      scope
	// nameOff and routeOff locate the name and the route, for the problems
	// found when the rules of a plan are put together.
	nameOff, routeOff int64
}

// planSrc is a plan as read from the document.
type planSrc struct {
	name    string
	named   bool
	nameOff int64
	extends string
	extOff  int64
	hasExt  bool
	s       scope
	own     []*ruleSrc
	state   resolution
	all     []*ruleSrc // own and inherited rules, once state is resolved
}

// resolution is where a plan is in the resolution of its inheritance.
type resolution uint8

const (
	unresolved resolution = iota
	resolving             // its ancestors are being resolved
	resolved
	failed // an ancestor is missing, or in a cycle, or the plan is invalid
)

// load parses and validates doc.
func load(doc []byte, file string) (*Rules, error) {
	ld := &loader{doc: doc, file: file}
	top := scope{}
	v, off, err := parseDocument(doc)
	if err != nil {
		ld.fail(top, "", off, err)
		return nil, errors.Join(ld.errs...)
	}
	ms, ok := ld.object(top, v)
	if !ok {
		return nil, errors.Join(ld.errs...)
	}
	fs := ld.fields(top, ms, docFields)
	ld.str(top, fs, "comment")

	// The shared rules.
	var shared []*ruleSrc
	if f, present := fs["shared_rules"]; present {
		shared = ld.rules(top, "shared_rules", f, "")
	}
	sharedNames := map[string]*ruleSrc{}
	for _, r := range shared {
		if !r.named {
			continue
		}
		if first, dup := sharedNames[r.Name]; dup {
			ld.failf(r.s, "name", r.nameOff, "%q is also the name of the shared rule at %s", r.Name, first.s.path)
			r.ok = false
			continue
		}
		sharedNames[r.Name] = r
	}

	// The plans.
	var plans []*planSrc
	byName := map[string]*planSrc{}
	if f, present := fs["plans"]; !present {
		ld.failf(top, "plans", v.off, "missing: a document needs at least one plan")
	} else if vs, ok := f.array(); !ok {
		ld.failf(top, "plans", f.off, "want an array of plans, got %s", f.kind())
	} else if len(vs) == 0 {
		ld.failf(top, "plans", f.off, "empty: a document needs at least one plan")
	} else {
		for i, pv := range vs {
			p := ld.plan(i, pv, sharedNames)
			plans = append(plans, p)
			if !p.named {
				continue
			}
			if first, dup := byName[p.name]; dup {
				ld.failf(p.s, "name", p.nameOff, "plan %q is declared twice (first at %s)", p.name, first.s.path)
				continue
			}
			byName[p.name] = p
		}
	}

	// Inheritance.
	for _, p := range plans {
		ld.resolve(p, byName, nil)
	}

	// The route tables.
	rs := &Rules{plans: map[string]*plan{}}
	rs.shared = ld.table(sharedPlan, "", shared)
	if len(rs.shared.rules) == 0 {
		rs.shared = nil
	}
	for _, p := range plans {
		if !p.named || byName[p.name] != p || p.state != resolved {
			continue
		}
		t := ld.table(p.name, p.name, p.all)
		rs.plans[p.name] = &plan{name: p.name, rules: t.rules, table: t}
		rs.order = append(rs.order, p.name)
	}

	if name, present, ok := ld.str(top, fs, "default_plan"); present && ok {
		if rs.def = rs.plans[name]; rs.def == nil && byName[name] == nil {
			ld.failf(top, "default_plan", fs["default_plan"].off, "unknown plan %q", name)
		}
	}
	if len(ld.errs) > 0 {
		return nil, ld.join()
	}
	return rs, nil
}

// join returns the problems found, in the order of the document (those at
// no particular place last), as one error.
func (ld *loader) join() error {
	slices.SortStableFunc(ld.errs, func(a, b error) int {
		ea, eb := a.(*Error), b.(*Error)
		return cmp.Or(
			cmp.Compare(boolInt(ea.Line == 0), boolInt(eb.Line == 0)),
			cmp.Compare(ea.Line, eb.Line),
			cmp.Compare(ea.Column, eb.Column))
	})
	return errors.Join(ld.errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// plan reads plan i of the document.
func (ld *loader) plan(i int, v value, sharedNames map[string]*ruleSrc) *planSrc {
	s := scope{path: fmt.Sprintf("plans[%d]", i), where: fmt.Sprintf("plan #%d", i+1)}
	p := &planSrc{s: s}
	ms, ok := ld.object(s, v)
	if !ok {
		p.state = failed
		return p
	}
	if p.name, p.nameOff, p.named = ld.name(s, ms, v); p.named {
		p.s.plan, p.s.where = p.name, fmt.Sprintf("plan %q", p.name)
	}
	fs := ld.fields(p.s, ms, planFields)
	ld.str(p.s, fs, "comment")
	if ext, present, ok := ld.str(p.s, fs, "extends"); present {
		p.hasExt, p.extends, p.extOff = true, ext, fs["extends"].off
		if ok && ext == "" {
			ld.failf(p.s, "extends", p.extOff, "empty (leave the field out for a plan that extends none)")
			p.state = failed
		} else if !ok {
			p.state = failed
		}
	}
	if f, present := fs["rules"]; present {
		p.own = ld.rules(p.s, "rules", f, p.name)
	}
	names := map[string]*ruleSrc{}
	for _, r := range p.own {
		if !r.named {
			continue
		}
		if first, dup := names[r.Name]; dup {
			ld.failf(r.s, "name", r.nameOff, "%q is also the name of the rule at %s", r.Name, first.s.path)
			r.ok = false
			continue
		}
		names[r.Name] = r
		if sh := sharedNames[r.Name]; sh != nil {
			ld.failf(r.s, "name", r.nameOff, "%q is also the name of the shared rule at %s", r.Name, sh.s.path)
			r.ok = false
		}
	}
	return p
}

// rules reads the array of rules in field name of s: the rules of plan
// (which may be unnamed: ""), or the shared rules if s is the document.
func (ld *loader) rules(s scope, name string, v value, plan string) []*ruleSrc {
	vs, ok := v.array()
	if !ok {
		ld.failf(s, name, v.off, "want an array of rules, got %s", v.kind())
		return nil
	}
	owner := s.where // `plan "free"`, `plan #2`
	if s.path == "" {
		owner = "shared"
	}
	var out []*ruleSrc
	for i, rv := range vs {
		rs := scope{path: fmt.Sprintf("%s[%d]", s.at(name), i), plan: s.plan, where: fmt.Sprintf("%s rule #%d", owner, i+1)}
		out = append(out, ld.rule(rs, owner, rv, plan))
	}
	return out
}

// rule reads and validates one rule of owner (`plan "free"`, `shared`).
func (ld *loader) rule(s scope, owner string, v value, plan string) *ruleSrc {
	r := &ruleSrc{s: s}
	r.Plan = plan
	ms, ok := ld.object(s, v)
	if !ok {
		return r
	}
	n0 := len(ld.errs)
	if r.Name, r.nameOff, r.named = ld.name(s, ms, v); r.named {
		r.s.rule = r.Name
		r.s.where = fmt.Sprintf("%s rule %q", owner, r.Name)
	}
	s = r.s
	fs := ld.fields(s, ms, ruleFields)
	ld.str(s, fs, "comment")

	// tier
	tier, present, ok := ld.str(s, fs, "tier")
	switch {
	case !present:
		ld.failf(s, "tier", v.off, "missing (want user, api_key, ip, endpoint, global or header:NAME)")
	case ok:
		var err error
		if r.kind, r.header, err = parseTier(tier); err != nil {
			ld.fail(s, s.at("tier"), fs["tier"].off, err)
		} else {
			r.Tier = tier
			if r.kind == tierHeader {
				r.Tier = "header:" + r.header
			}
		}
	}

	// route
	if route, present, ok := ld.str(s, fs, "route"); present && ok {
		if route == "" {
			ld.failf(s, "route", fs["route"].off, "empty (leave the field out for a rule that applies to every request)")
		} else if err := checkRoute(route); err != nil {
			ld.fail(s, s.at("route"), fs["route"].off, err)
		} else {
			r.Route, r.routeOff = route, fs["route"].off
		}
	}
	if ok && present && r.kind == tierEndpoint && r.Route == "" {
		if _, hasRoute := fs["route"]; !hasRoute {
			ld.failf(s, "tier", fs["tier"].off, "the endpoint tier needs a route: its bucket is the route's")
		}
	}

	// rate
	if f, present := fs["rate"]; !present {
		ld.failf(s, "rate", v.off, "missing (tokens per second, or a string such as \"100/min\")")
	} else if rate, err := rateOf(f); err != nil {
		ld.fail(s, s.at("rate"), f.off, err)
	} else {
		r.Limit.Rate = rate
	}

	// burst
	burstOK := false
	if f, present := fs["burst"]; !present {
		ld.failf(s, "burst", v.off, "missing (the bucket's capacity, in tokens)")
	} else if b, ok := f.integer(); !ok {
		ld.failf(s, "burst", f.off, "want an integer, got %s", f.kind())
	} else if b < 1 || b > limit.MaxBurst {
		ld.failf(s, "burst", f.off, "%d is outside [1, %d]", b, limit.MaxBurst)
	} else {
		r.Limit.Burst, burstOK = b, true
	}

	// cost
	r.Cost = 1
	if f, present := fs["cost"]; present {
		if c, ok := f.integer(); !ok {
			ld.failf(s, "cost", f.off, "want an integer, got %s", f.kind())
		} else if c < 1 {
			ld.failf(s, "cost", f.off, "%d is less than 1", c)
		} else if burstOK && c > r.Limit.Burst {
			ld.failf(s, "cost", f.off, "%d is more than the burst %d: no request could ever pass", c, r.Limit.Burst)
		} else {
			r.Cost = c
		}
	}

	// mode
	if m, present, ok := ld.str(s, fs, "mode"); present && ok {
		switch m {
		case "lease":
			r.Limit.Mode = hybrid.Lease
		case "optimistic":
			r.Limit.Mode = hybrid.Optimistic
		case "exact":
			r.Limit.Mode = hybrid.Exact
		default:
			ld.failf(s, "mode", fs["mode"].off, "%q is not lease, optimistic or exact", m)
		}
	}

	r.ok = len(ld.errs) == n0
	if r.ok {
		// The limiter's own validation, as a last guard: the checks above
		// mirror it.
		ml, err := limit.Limit{Rate: r.Limit.Rate, Burst: r.Limit.Burst}.Micro()
		if err == nil {
			_, err = ml.Cost(r.Cost)
		}
		if err != nil {
			ld.fail(s, s.path, v.off, err)
			r.ok = false
		}
	}
	return r
}

// resolve sets p.all to its rules with those of the plans it extends,
// a rule of p replacing the inherited rule of the same name. stack is the
// chain of plans being resolved, to report a cycle.
func (ld *loader) resolve(p *planSrc, byName map[string]*planSrc, stack []*planSrc) bool {
	switch p.state {
	case resolving:
		names := make([]string, 0, len(stack)+1)
		for _, q := range stack[slices.Index(stack, p):] {
			names = append(names, q.name)
		}
		last := stack[len(stack)-1]
		ld.failf(last.s, "extends", last.extOff, "cycle: %s -> %s", strings.Join(names, " -> "), p.name)
		return false
	case resolved:
		return true
	case failed:
		return false
	}
	if !p.named {
		p.state = failed
		return false
	}
	p.state = resolving
	var inherited []*ruleSrc
	if p.hasExt {
		parent := byName[p.extends]
		if parent == nil {
			ld.failf(p.s, "extends", p.extOff, "unknown plan %q", p.extends)
			p.state = failed
			return false
		}
		if !ld.resolve(parent, byName, append(stack, p)) {
			p.state = failed
			return false
		}
		inherited = parent.all
	}
	p.all = slices.Clone(inherited)
	for _, r := range p.own {
		if i := slices.IndexFunc(p.all, func(q *ruleSrc) bool { return r.named && q.Name == r.Name }); i >= 0 {
			p.all[i] = r
		} else {
			p.all = append(p.all, r)
		}
	}
	p.state = resolved
	return true
}

// table builds the route table of a plan's resolved rules (planName "" for
// the shared rules), reporting conflicting routes. Invalid rules are left
// out: they are reported already.
func (ld *loader) table(planKey, planName string, srcs []*ruleSrc) *table {
	var (
		valid   []*ruleSrc
		rules   []Rule
		kinds   []tierKind
		headers []string
	)
	for _, r := range srcs {
		if r.ok {
			valid = append(valid, r)
			rules = append(rules, r.Rule)
			kinds = append(kinds, r.kind)
			headers = append(headers, r.header)
		}
	}
	t, errs := newTable(planKey, rules, kinds, headers)
	for _, i := range slices.Sorted(maps.Keys(errs)) {
		e := errs[i]
		r, other := valid[i], (*ruleSrc)(nil)
		if e.other >= 0 {
			other = valid[e.other]
		}
		switch {
		case r.Plan == planName:
		case other != nil && other.Plan == planName:
			r, other = other, r
		default:
			continue // between inherited rules: reported with the plan that has both
		}
		if other == nil {
			ld.failf(r.s, "route", r.routeOff, "%s", e.msg)
			continue
		}
		of := ""
		if other.Plan != planName {
			of = fmt.Sprintf(" (inherited from plan %q)", other.Plan)
		}
		ld.failf(r.s, "route", r.routeOff, "%q conflicts with the route %q of rule %q%s: %s", r.Route, other.Route, other.Name, of, e.msg)
	}
	return t
}
