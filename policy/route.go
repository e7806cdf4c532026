package policy

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// marker is the handler registered for a route pattern on a table's mux:
// the index of the route's rules in table.byRoute.
type marker int

func (marker) ServeHTTP(http.ResponseWriter, *http.Request) {}

// table is the rules of one plan (or the shared rules) ready for decisions.
// A ServeMux holds their route patterns, so that a request matches the
// pattern ServeMux itself would pick, with its precedence and its cleaning
// of paths.
type table struct {
	rules   []Rule
	mux     *http.ServeMux // nil if no rule has a route
	base    []compiled     // the rules without a route, by rank
	byRoute [][]compiled   // per marker: base and the route's rules, by rank
}

// match returns the rules that apply to r. A request that ServeMux would
// redirect (to a cleaned path, or to add a trailing slash) or answer with
// 404 or 405 matches no route.
func (t *table) match(r *http.Request) []compiled {
	if t.mux != nil && r.URL != nil {
		if h, _ := t.mux.Handler(r); h != nil {
			if m, ok := h.(marker); ok {
				return t.byRoute[m]
			}
		}
	}
	return t.base
}

// routeError is a route that ServeMux rejects, or that conflicts with the
// route of an earlier rule.
type routeError struct {
	other int    // index of the conflicting rule, or -1
	msg   string // what ServeMux says
}

// register adds pattern to mux, turning the panic of Handle into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if e, ok := v.(error); ok {
				err = e
			} else {
				err = fmt.Errorf("%v", v)
			}
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// checkRoute reports whether pattern is a valid ServeMux pattern.
func checkRoute(pattern string) error {
	if !routing122() {
		return errors.New("ServeMux has the routing of Go 1.21 (GODEBUG httpmuxgo121=1), without methods or wildcards: rules with routes need the routing of Go 1.22")
	}
	if err := register(http.NewServeMux(), pattern, marker(0)); err != nil {
		return fmt.Errorf("invalid pattern: %w", err)
	}
	return nil
}

// routing122 reports whether ServeMux routes with methods and wildcards, as
// since Go 1.22; it does not if the program started with GODEBUG
// httpmuxgo121=1.
var routing122 = sync.OnceValue(func() bool {
	mux := http.NewServeMux()
	if register(mux, "GET /{x}", marker(1)) != nil {
		return false
	}
	h, _ := mux.Handler(&http.Request{Method: "GET", Host: "example.com", URL: &url.URL{Path: "/a"}})
	return h == marker(1)
})

// conflictText returns ServeMux's explanation of a conflict, without its
// first line (which names the source lines that registered the patterns).
func conflictText(err error) string {
	s := err.Error()
	if _, rest, ok := strings.Cut(s, "\n"); ok {
		return strings.Join(strings.Fields(rest), " ")
	}
	return s
}

// newTable builds the table of rules (whose routes are all valid patterns),
// compiling them for planKey. Routes that conflict are left out and reported
// as errs[i] for rule i.
func newTable(planKey string, rules []Rule, kinds []tierKind, headers []string) (*table, map[int]routeError) {
	t := &table{rules: rules}
	var errs map[int]routeError
	var routes []string // distinct patterns, by marker
	var firstOf []int   // the rule that registered each pattern
	var members [][]compiled
	for i := range rules {
		r := &rules[i]
		c := compile(planKey, r, kinds[i], headers[i])
		c.order = i
		if r.Route == "" {
			t.base = append(t.base, c)
			continue
		}
		m := slices.Index(routes, r.Route)
		if m < 0 {
			if t.mux == nil {
				t.mux = http.NewServeMux()
			}
			if err := register(t.mux, r.Route, marker(len(routes))); err != nil {
				if errs == nil {
					errs = map[int]routeError{}
				}
				errs[i] = conflict(routes, firstOf, r.Route, err)
				continue
			}
			m = len(routes)
			routes = append(routes, r.Route)
			firstOf = append(firstOf, i)
			members = append(members, nil)
		}
		members[m] = append(members[m], c)
	}
	if t.mux != nil && !slices.Contains(routes, "/") {
		// A catch-all for the rules without a route. It changes no match
		// (any other pattern is more specific than "/"), but spares
		// ServeMux its search for the methods of a 404 or 405, which
		// allocates. Equivalent patterns ("/{path...}") make it conflict:
		// then there is no catch-all.
		if register(t.mux, "/", marker(len(routes))) == nil {
			members = append(members, nil)
		}
	}
	byRank := func(a, b compiled) int { return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.order, b.order)) }
	slices.SortFunc(t.base, byRank)
	for _, cs := range members {
		all := append(slices.Clip(t.base), cs...)
		slices.SortFunc(all, byRank)
		t.byRoute = append(t.byRoute, all)
	}
	return t, errs
}

// conflict finds which registered route pattern conflicts with, by
// registering the two alone.
func conflict(routes []string, firstOf []int, pattern string, err error) routeError {
	for m, other := range routes {
		mux := http.NewServeMux()
		mux.Handle(other, marker(0))
		if e := register(mux, pattern, marker(1)); e != nil {
			return routeError{other: firstOf[m], msg: conflictText(e)}
		}
	}
	return routeError{other: -1, msg: err.Error()}
}
