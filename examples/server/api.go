package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/policy"
)

// apiKeyHeader carries a caller's API key.
const apiKeyHeader = "X-API-Key"

// account is what an API key stands for.
type account struct {
	// KeyID names the key in bucket keys, logs and responses: the secret
	// itself never leaves the table.
	KeyID string
	// User owns the key; a user may have several.
	User string
	// Plan names the user's plan in the rules.
	Plan string
}

// demoAccounts are the API keys the service knows, by secret. The package
// documentation and docs/http.md list them.
var demoAccounts = map[string]account{
	"demo-free-alice-1":     {KeyID: "alice-1", User: "alice", Plan: "free"},
	"demo-free-alice-2":     {KeyID: "alice-2", User: "alice", Plan: "free"},
	"demo-free-dave":        {KeyID: "dave-1", User: "dave", Plan: "free"},
	"demo-pro-bob":          {KeyID: "bob-1", User: "bob", Plan: "pro"},
	"demo-enterprise-carol": {KeyID: "carol-1", User: "carol", Plan: "enterprise"},
}

// checkRules reports rules that cannot serve accounts: a plan of an
// account that the rules do not name, or no default plan for anonymous
// callers.
func checkRules(rules *policy.Rules, accounts map[string]account) error {
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(accounts)) {
		if acct := accounts[key]; !slices.Contains(rules.Plans(), acct.Plan) {
			errs = append(errs, fmt.Errorf("no plan %q for the API key %q", acct.Plan, acct.KeyID))
		}
	}
	r, err := http.NewRequest(http.MethodGet, "/v1/items", nil)
	if err != nil {
		return err
	}
	if _, err := rules.Checks(r, policy.Identity{IP: "192.0.2.1"}); err != nil {
		errs = append(errs, fmt.Errorf("anonymous callers: %w (set default_plan)", err))
	}
	return errors.Join(errs...)
}

// api serves the JSON endpoints under /v1/ and identifies their callers.
type api struct {
	accounts map[string]account // read only
	clientIP httplimit.ClientIP
	reports  atomic.Uint64 // reports made, for their IDs
}

// newAPI returns the API for accounts, which it does not modify, finding
// client addresses with clientIP.
func newAPI(accounts map[string]account, clientIP httplimit.ClientIP) *api {
	return &api{accounts: accounts, clientIP: clientIP}
}

// identify returns who r comes from, for the rules: the account of its
// API key, or for a request without a known key nobody, on the default
// plan; both with the client address (behind trusted proxies, an IPv6
// client's /64). A request with an unknown key is limited as an
// anonymous one, so guessing keys is limited per address, and answered 401
// by handler once allowed.
func (a *api) identify(r *http.Request) (policy.Identity, error) {
	ip, _ := a.clientIP.Key(r) // never an error
	id := policy.Identity{IP: strings.TrimPrefix(ip, "ip:")}
	if acct, ok := a.accounts[r.Header.Get(apiKeyHeader)]; ok {
		id.Plan, id.User, id.APIKey = acct.Plan, acct.User, acct.KeyID
	}
	return id, nil
}

// handler returns the handler of the endpoints. It answers 401 to a
// request whose API key is unknown.
func (a *api) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/items", a.listItems)
	mux.HandleFunc("GET /v1/items/{id}", a.getItem)
	mux.HandleFunc("POST /v1/reports", a.createReport)
	mux.HandleFunc("GET /v1/me", a.me)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key := r.Header.Get(apiKeyHeader); key != "" {
			if _, ok := a.accounts[key]; !ok {
				unauthorized(w, "The API key is not known.")
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// item is an entry of the catalogue.
type item struct {
	ID    int    `json:"id"`
	Name  string `json:"name"`
	Stock int    `json:"stock"`
}

// catalogue is the data the API serves. It is never modified.
var catalogue = []item{
	{ID: 1, Name: "anvil", Stock: 12},
	{ID: 2, Name: "rope, 10 m", Stock: 40},
	{ID: 3, Name: "lantern", Stock: 3},
	{ID: 4, Name: "compass", Stock: 19},
}

// lowStock is the stock under which a report flags an item.
const lowStock = 5

// listItems serves GET /v1/items.
func (a *api) listItems(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"items": catalogue})
}

// getItem serves GET /v1/items/{id}.
func (a *api) getItem(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err == nil {
		for _, it := range catalogue {
			if it.ID == id {
				writeJSON(w, http.StatusOK, it)
				return
			}
		}
	}
	writeProblem(w, http.StatusNotFound, "There is no item "+strconv.Quote(r.PathValue("id"))+".")
}

// report is the answer of POST /v1/reports.
type report struct {
	ID         string `json:"id"`
	User       string `json:"user"`
	Plan       string `json:"plan"`
	Items      int    `json:"items"`
	TotalStock int    `json:"total_stock"`
	LowStock   []int  `json:"low_stock"`
}

// createReport serves POST /v1/reports: a stock report on the items of
// the body, {"items": [1, 3]}, or on all of them for an empty body. It
// needs an API key.
func (a *api) createReport(w http.ResponseWriter, r *http.Request) {
	acct, ok := a.accounts[r.Header.Get(apiKeyHeader)]
	if !ok {
		unauthorized(w, "Reports need an API key.")
		return
	}
	var req struct {
		Items []int `json:"items"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeProblem(w, http.StatusBadRequest, "The body is not a report request such as {\"items\": [1, 3]}.")
		return
	}
	rep := report{
		ID:   "r-" + strconv.FormatUint(a.reports.Add(1), 10),
		User: acct.User, Plan: acct.Plan,
		LowStock: []int{},
	}
	for _, it := range catalogue {
		if len(req.Items) > 0 && !slices.Contains(req.Items, it.ID) {
			continue
		}
		rep.Items++
		rep.TotalStock += it.Stock
		if it.Stock < lowStock {
			rep.LowStock = append(rep.LowStock, it.ID)
		}
	}
	writeJSON(w, http.StatusOK, rep)
}

// me serves GET /v1/me: who the service takes the caller for.
func (a *api) me(w http.ResponseWriter, r *http.Request) {
	who := map[string]any{"client_ip": a.clientIP.Addr(r).String()}
	if acct, ok := a.accounts[r.Header.Get(apiKeyHeader)]; ok {
		who["user"], who["plan"], who["key_id"] = acct.User, acct.Plan, acct.KeyID
	} else {
		who["anonymous"] = true
	}
	writeJSON(w, http.StatusOK, who)
}

// unauthorized answers 401 with a problem body.
func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `APIKey header="`+apiKeyHeader+`"`)
	writeProblem(w, http.StatusUnauthorized, detail)
}

// writeJSON writes v as the JSON body of a response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "The response could not be encoded.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// writeProblem writes an RFC 9457 problem body with status.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(map[string]any{ // strings and an int: no error
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// tierCounter counts denials by tier. It is safe for concurrent use.
type tierCounter struct {
	mu sync.Mutex // protects n
	n  map[string]uint64
}

// newTierCounter returns a tierCounter with no counts.
func newTierCounter() *tierCounter {
	return &tierCounter{n: make(map[string]uint64)}
}

// add counts a denial by tier.
func (c *tierCounter) add(tier string) {
	c.mu.Lock()
	c.n[tier]++
	c.mu.Unlock()
}

// read returns a copy of the counts, by tier.
func (c *tierCounter) read() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}
