// Package policy loads rate-limit rules from data: plans (free, pro,
// enterprise, ...) of rules, each with a tier that says what identifies its
// bucket (the user, the API key, the client IP, a request header, the
// endpoint, or nothing: one global bucket), an optional route pattern in the
// syntax of net/http's ServeMux, a rate, a burst, a cost and a settlement
// mode. For each request, Checks turns the rules that apply to it into the
// hybrid.Check list that Limiter.AllowAll decides at once: every tier must
// pass, and none is consumed when one denies.
//
// A document is JSON; Load and LoadFile decode it strictly (an unknown field
// is an error) and validate every rule, reporting every problem at once, each
// naming its plan, its rule, its field and its line. docs/policy.md describes
// the format, the validation and the keys.
package policy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/hybridlimit/hybrid"
)

// Identity is who a request comes from, as the application established it
// (from a session, a verified token, the trusted-proxy client IP, ...).
// A field that is empty skips the rules whose tier needs it: a rule applies
// to the requests that carry its identity.
type Identity struct {
	// Plan names the caller's plan. "" or a plan the rules do not name
	// means the document's default_plan; if it names none, Checks returns
	// ErrUnknownPlan.
	Plan string
	// User identifies the caller, for the tier "user".
	User string
	// APIKey identifies the credential, for the tier "api_key". Pass an
	// identifier of the key rather than the secret itself if keys are
	// secrets: it ends up in Redis key names.
	APIKey string
	// IP is the client address, for the tier "ip", as the caller gives it:
	// normalize it (netip.Addr.String) and, if one bucket per IPv6 network
	// is wanted, mask it (to a /64, say) before.
	IP string
}

// Errors.
var (
	// ErrInvalid is matched (with errors.Is) by every *Error of Load and
	// LoadFile.
	ErrInvalid = errors.New("policy: invalid rules")
	// ErrUnknownPlan is returned by Checks for a plan the rules do not name
	// when they name no default plan.
	ErrUnknownPlan = errors.New("policy: unknown plan")
)

// Rules is a loaded, validated document of plans and rules. It is immutable
// and safe for concurrent use. Create one with Load or LoadFile; the zero
// Rules has no plan.
type Rules struct {
	plans  map[string]*plan
	order  []string // plan names in document order
	def    *plan    // the default plan, or nil
	shared *table   // shared_rules, for every plan
}

// plan is a plan resolved for decisions: its own and inherited rules.
type plan struct {
	name  string
	rules []Rule // as resolved, in document order
	table *table
}

// Rule is one rule as loaded, with its inheritance resolved.
type Rule struct {
	// Name is unique within its plan and among the shared rules. It is the
	// Tier of the checks the rule produces.
	Name string
	// Plan is the plan that declares the rule: for an inherited rule, an
	// ancestor of the plan that applies it. It is "" for a shared rule.
	Plan string
	// Tier is what identifies the rule's bucket: "user", "api_key", "ip",
	// "endpoint", "global", or "header:" and a canonical header name.
	Tier string
	// Route is the rule's route pattern, in ServeMux syntax, or "" if the
	// rule applies to every request.
	Route string
	// Limit is the rule's rate, burst and mode.
	Limit hybrid.Limit
	// Cost is the tokens a request takes, at least 1.
	Cost int64
}

// Plans returns the names of the plans, in document order.
func (rs *Rules) Plans() []string { return slices.Clone(rs.order) }

// Plan returns the rules of the named plan, its inherited ones included,
// and whether the plan exists. The shared rules are not included.
func (rs *Rules) Plan(name string) ([]Rule, bool) {
	p, ok := rs.plans[name]
	if !ok {
		return nil, false
	}
	return slices.Clone(p.rules), true
}

// Shared returns the shared rules, which apply to every plan.
func (rs *Rules) Shared() []Rule {
	if rs.shared == nil {
		return nil
	}
	return slices.Clone(rs.shared.rules)
}

// Checks returns the checks that a request r from id must pass, for
// hybrid.Limiter.AllowAll: one per rule of id's plan and per shared rule
// that applies to r (its route, if it has one, is the pattern ServeMux
// would choose for r) and whose identity id carries. It is AppendChecks to
// a new slice.
func (rs *Rules) Checks(r *http.Request, id Identity) ([]hybrid.Check, error) {
	return rs.AppendChecks(nil, r, id)
}

// AppendChecks appends to dst the checks that Checks returns and returns
// the extended slice; a caller that reuses dst saves an allocation.
//
// Checks come in the order that keeps denials cheap: the caller's own
// buckets first (tiers user, api_key and ip, then header), then the
// endpoint ones, then the global ones; in document order within each group,
// the plan's rules before the shared ones. AllowAll stops at the first tier
// that denies and gives back what the tiers before it took, so a caller
// denied by its own limit never touches, not even briefly, a bucket that
// other callers share.
//
// Each check's Tier is the rule's name, and its Key names the bucket: the
// plan ("*" for a shared rule), the rule, the tier and the identity's
// value, separated by '|', with a value longer than 128 bytes replaced by
// its SHA-256 (docs/policy.md). Keys of different plans, rules or tiers
// never collide, and every key is within the limiter's bound.
func (rs *Rules) AppendChecks(dst []hybrid.Check, r *http.Request, id Identity) ([]hybrid.Check, error) {
	p := rs.plans[id.Plan]
	if p == nil {
		if p = rs.def; p == nil {
			return dst, fmt.Errorf("%w %q", ErrUnknownPlan, id.Plan)
		}
	}
	a := p.table.match(r)
	var b []compiled
	if rs.shared != nil {
		b = rs.shared.match(r)
	}
	if dst == nil {
		dst = make([]hybrid.Check, 0, len(a)+len(b))
	}
	for len(a) > 0 || len(b) > 0 {
		var c *compiled
		if len(b) == 0 || len(a) > 0 && a[0].rank <= b[0].rank {
			c, a = &a[0], a[1:]
		} else {
			c, b = &b[0], b[1:]
		}
		if ch, ok := c.check(r, &id); ok {
			dst = append(dst, ch)
		}
	}
	return dst, nil
}

// ChecksFunc returns a function of the request alone, the form an HTTP
// middleware asks for: it learns the Identity with identify (which must not
// be nil), then returns Checks. An error of identify is returned wrapped.
func (rs *Rules) ChecksFunc(identify func(r *http.Request) (Identity, error)) func(r *http.Request) ([]hybrid.Check, error) {
	return func(r *http.Request) ([]hybrid.Check, error) {
		id, err := identify(r)
		if err != nil {
			return nil, fmt.Errorf("policy: identify: %w", err)
		}
		return rs.AppendChecks(nil, r, id)
	}
}
