// Package httplimit is net/http middleware that rate-limits requests with a
// hybrid.Limiter: it keys each request (by client address behind trusted
// proxies, API key, user, or anything a function can compute), prices it,
// asks the Limiter about every tier at once, reports the limits in the
// response headers and answers a denied request with 429 Too Many Requests.
//
// A Middleware is built from a Limiter and a Config:
//
//	mw, err := httplimit.New(lim, httplimit.Config{
//		Key:   httplimit.ClientIP{TrustedProxies: proxies}.Key,
//		Limit: hybrid.Limit{Rate: 10, Burst: 20},
//	})
//	...
//	http.ListenAndServe(addr, mw.Handler(mux))
//
// Config.Checks replaces the single tier with any number of tiers (a plan
// per customer, a per-user limit and a per-endpoint limit): a request passes
// only if every tier does, and a denied request consumes nothing in any
// tier (hybrid.Limiter.AllowAll).
//
// Every response carries the fields of draft-ietf-httpapi-ratelimit-headers
// (RateLimit-Policy and RateLimit, every tier) and the legacy
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (the tier
// closest to denying); Config.Headers selects them. A denial has
// Retry-After and an RFC 9457 problem body.
//
// Redis failures never reach the middleware: the Limiter answers through
// its fallback policy. The errors it can meet are misuse and a closed
// Limiter; ErrorStatus says which status answers each.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Headers selects the families of rate-limit response header fields.
type Headers uint8

// The header families. Combine them with |.
const (
	// RateLimitHeader is the RateLimit field of
	// draft-ietf-httpapi-ratelimit-headers: the quota left in every tier.
	RateLimitHeader Headers = 1 << iota
	// PolicyHeader is the RateLimit-Policy field: every tier's quota and
	// window.
	PolicyHeader
	// LegacyHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset, for the tier closest to denying.
	LegacyHeaders
	// NoHeaders sends none of them. Retry-After is still sent on a denial.
	NoHeaders

	// IETFHeaders are the two fields of the draft.
	IETFHeaders = RateLimitHeader | PolicyHeader
	// AllHeaders are every family: the default.
	AllHeaders = IETFHeaders | LegacyHeaders
)

// Config configures a Middleware. A zero field means its documented default.
// Set either the single-tier fields (Key, Limit, Cost, Name) or Checks.
type Config struct {
	// Name names the single tier: the policy name in the header fields and
	// the problem body, and the start of its bucket keys. "" means
	// "default". It must be printable ASCII.
	Name string
	// Key keys a request in the single tier. nil means ClientIP{}.Key:
	// the peer's address, trusting no proxy. The bucket key is Name, a
	// colon and Key's result, so that middlewares sharing a Limiter under
	// different names do not share buckets. A bucket key longer than 256
	// bytes, or one that starts with "sha256:", is replaced by "sha256:"
	// and its SHA-256 in hex: a long key is still limited, within the
	// Limiter's bound on keys, and cannot share a short key's bucket.
	Key KeyFunc
	// Limit is the single tier's limit. It is validated by New.
	Limit hybrid.Limit
	// Cost prices a request in the single tier, in tokens: 1 for a cheap
	// GET, 10 for a report. nil means 1 for every request; a result of 0
	// means 1. A negative cost, or one above the burst, can never be met:
	// the request is answered 400 (ErrorStatus), never admitted.
	Cost func(r *http.Request) int64

	// Checks, if not nil, replaces the single tier: it returns the tiers a
	// request is checked against (plans, per-user and per-endpoint limits).
	// The request passes only if every check does, and then the tokens of
	// every check are taken. An empty slice exempts the request: it is
	// served with no decision and no header (health checks, CORS
	// preflights). An error is answered as ErrorStatus says: wrap ErrNoKey
	// for a 400. Keys are used as they are, but for the long ones (see
	// Key), and the slice is not modified, so it may be shared. A Check
	// with an empty Tier is named "default" if it is the only one, else
	// "tier" and its index.
	Checks func(r *http.Request) ([]hybrid.Check, error)

	// MaxWait, if above 0, lets a request over its limit wait up to that
	// long for its tokens, within its own context (Limiter.WaitAll), rather
	// than be refused at once: it then goes ahead, or is answered 429 as
	// usual once its tokens would come later than that (at once, without
	// waiting). A single tier's request takes its tokens ahead of time and
	// sleeps until they are due. For smoothing bursts (nginx's limit_req
	// without nodelay), not for queueing floods: a waiting request holds
	// its goroutine and connection. 0 refuses at once; a negative MaxWait
	// is an error of New.
	MaxWait time.Duration

	// Headers selects the rate-limit header fields sent on every
	// response. 0 means AllHeaders.
	Headers Headers
	// LegacyResetUnix sends X-RateLimit-Reset as a Unix time in seconds,
	// as GitHub does, at the cost of a clock read per request. false sends
	// the seconds until the reset, like Retry-After and the t of RateLimit:
	// no clock read, and immune to clock skew between client and server.
	LegacyResetUnix bool

	// Shadow decides and counts every request, and calls OnDenied, but
	// serves the request whatever the decision: for rolling out a new
	// limit. An error is counted and the request is served too.
	Shadow bool
	// ShadowHeaders sends the rate-limit header fields in Shadow mode as
	// well. false sends none: clients do not slow down for a limit that is
	// not enforced yet.
	ShadowHeaders bool

	// OnDenied, if not nil, is called for every denied request, shadow
	// denials too, before the request is answered (or, in Shadow mode,
	// served). It is called on the request's goroutine with no lock held.
	OnDenied func(Denial)
	// DenyResponse answers a denied request; it must write the response.
	// The header fields and Retry-After are already set on w. nil means
	// WriteDenial: 429 with an RFC 9457 problem body.
	DenyResponse func(w http.ResponseWriter, r *http.Request, d Denial)
	// ErrorResponse answers a request that could not be decided. nil means
	// WriteError: the status of ErrorStatus with a problem body.
	ErrorResponse func(w http.ResponseWriter, r *http.Request, err error)
}

// Denial describes a denied request, for Config.OnDenied and
// Config.DenyResponse.
type Denial struct {
	// Request is the denied request.
	Request *http.Request
	// Tier names the tier that denied, Key is its bucket key and Limit its
	// limit.
	Tier, Key string
	Limit     hybrid.Limit
	// Cost is the tokens the request asked of that tier.
	Cost int64
	// Remaining is the whole tokens left in that tier.
	Remaining int64
	// RetryAfter estimates how long until the request could pass.
	RetryAfter time.Duration
	// Shadow reports a denial in Shadow mode: the request is served.
	Shadow bool
}

// RetryAfterSeconds returns d.RetryAfter in whole seconds, rounded up, and at
// least 1: the Retry-After of the denial.
func (d Denial) RetryAfterSeconds() int64 {
	return max(ceilSeconds(d.RetryAfter), 1)
}

// Stats is a snapshot of a Middleware's counters.
type Stats struct {
	// Allowed counts the requests that passed every tier.
	Allowed uint64
	// Denied counts the requests denied and answered 429 (or by
	// Config.DenyResponse).
	Denied uint64
	// ShadowDenied counts the requests that a tier denied in Shadow mode
	// and that were served.
	ShadowDenied uint64
	// Errors counts the requests that could not be decided (ErrorStatus).
	Errors uint64
	// Exempt counts the requests for which Config.Checks returned no check.
	Exempt uint64
	// Waited counts the requests over their limit that waited for their
	// tokens (Config.MaxWait) and were then served; they are counted in
	// Allowed too. Those whose wait ended without them are in Denied (or
	// Errors, for a request whose context ended).
	Waited uint64
}

// Middleware rate-limits the requests of the handlers it wraps. It is safe
// for concurrent use. Create one with New.
type Middleware struct {
	lim *hybrid.Limiter

	// The single tier; checks is nil then.
	name      string
	keyPrefix string // name + ":"
	key       KeyFunc
	limit     hybrid.Limit
	cost      func(*http.Request) int64
	policy    string // the RateLimit-Policy value of the single tier
	checks    func(*http.Request) ([]hybrid.Check, error)

	maxWait   time.Duration
	headers   Headers
	resetUnix bool
	shadow    bool
	onDenied  func(Denial)
	denyResp  func(http.ResponseWriter, *http.Request, Denial)
	errResp   func(http.ResponseWriter, *http.Request, error)
	counters  [nShards]shard
}

// nShards is the number of counter shards: concurrent requests mostly
// update different cache lines.
const nShards = 16

// shard is one cache line of counters.
type shard struct {
	allowed, denied, shadowDenied, errors, exempt, waited atomic.Uint64
	_                                                     [128 - 6*8]byte
}

// New returns a Middleware that decides with lim as cfg says. It reports a
// nil lim, a Config that sets both the single tier and Checks, an invalid
// Limit and a Name that is not printable ASCII.
func New(lim *hybrid.Limiter, cfg Config) (*Middleware, error) {
	if lim == nil {
		return nil, errors.New("httplimit: nil Limiter")
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("httplimit: MaxWait %v is negative", cfg.MaxWait)
	}
	m := &Middleware{
		lim:       lim,
		maxWait:   cfg.MaxWait,
		checks:    cfg.Checks,
		headers:   cfg.Headers,
		resetUnix: cfg.LegacyResetUnix,
		shadow:    cfg.Shadow,
		onDenied:  cfg.OnDenied,
		denyResp:  cfg.DenyResponse,
		errResp:   cfg.ErrorResponse,
	}
	if m.headers == 0 {
		m.headers = AllHeaders
	}
	if m.headers&NoHeaders != 0 || cfg.Shadow && !cfg.ShadowHeaders {
		m.headers = 0
	}
	if m.denyResp == nil {
		m.denyResp = WriteDenial
	}
	if m.errResp == nil {
		m.errResp = WriteError
	}
	if cfg.Checks != nil {
		if cfg.Key != nil || cfg.Cost != nil || cfg.Limit != (hybrid.Limit{}) || cfg.Name != "" {
			return nil, errors.New("httplimit: Config sets both Checks and the single tier (Name, Key, Limit, Cost)")
		}
		return m, nil
	}
	m.name = cfg.Name
	if m.name == "" {
		m.name = "default"
	}
	for i := 0; i < len(m.name); i++ {
		if b := m.name[i]; b < 0x20 || b > 0x7e {
			return nil, fmt.Errorf("httplimit: Name %q is not printable ASCII", m.name)
		}
	}
	if _, err := reconcile.NewSpec(cfg.Limit.Rate, cfg.Limit.Burst, cfg.Limit.Mode); err != nil {
		return nil, fmt.Errorf("httplimit: Limit %+v: %w", cfg.Limit, err)
	}
	m.keyPrefix = m.name + ":"
	m.key = cfg.Key
	if m.key == nil {
		m.key = ClientIP{}.Key
	}
	m.limit = cfg.Limit
	m.cost = cfg.Cost
	m.policy = string(appendPolicy(nil, m.name, cfg.Limit))
	return m, nil
}

// Handler returns a handler that rate-limits the requests for next. As a
// method value, m.Handler is the func(http.Handler) http.Handler of
// middleware chains.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// Wrap is Handler for a handler function.
func (m *Middleware) Wrap(next func(http.ResponseWriter, *http.Request)) http.Handler {
	return m.Handler(http.HandlerFunc(next))
}

// Stats returns a snapshot of m's counters.
func (m *Middleware) Stats() Stats {
	var s Stats
	for i := range m.counters {
		c := &m.counters[i]
		s.Allowed += c.allowed.Load()
		s.Denied += c.denied.Load()
		s.ShadowDenied += c.shadowDenied.Load()
		s.Errors += c.errors.Load()
		s.Exempt += c.exempt.Load()
		s.Waited += c.waited.Load()
	}
	return s
}

// Reset makes the bucket of key full again across the fleet
// (hybrid.Limiter.Reset): an operator unblocking a client, from an admin
// tool or a handler of the service's own (the middleware serves no endpoint
// for it). key is what the single tier's Key returns for the client (its
// address, say), or, for a Middleware of Checks, a Check's Key; a long key
// is hashed as the middleware hashes it. Its errors are Reset's: while
// Redis is down, one wrapping hybrid.ErrUnavailable.
func (m *Middleware) Reset(ctx context.Context, key string) error {
	if m.checks == nil {
		key = m.keyPrefix + key
	}
	bk, err := BucketKey(key)
	if err != nil {
		return err
	}
	return m.lim.Reset(ctx, bk)
}

// shard returns a counter shard, picked at random.
func (m *Middleware) shard() *shard {
	return &m.counters[rand.Uint32()%nShards]
}

// serve decides r and serves it with next, or answers it.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	var arrived time.Time // for MaxWait, which counts from here
	if m.maxWait > 0 {
		arrived = time.Now()
	}
	var one [1]hybrid.Check
	checks, err := m.checksFor(r, one[:0])
	if err != nil {
		m.fail(w, r, next, err)
		return
	}
	if len(checks) == 0 {
		m.shard().exempt.Add(1)
		next.ServeHTTP(w, r)
		return
	}
	d, err := m.lim.AllowAll(r.Context(), checks...)
	if err != nil {
		m.fail(w, r, next, err)
		return
	}
	if m.headers != 0 {
		m.setHeaders(w.Header(), checks, &d)
	}
	if d.Allowed {
		m.shard().allowed.Add(1)
		next.ServeHTTP(w, r)
		return
	}
	if !m.shadow && m.maxWait > 0 && d.Result().RetryAfter <= m.maxWait {
		if err := m.wait(r, checks, arrived); err == nil {
			sh := m.shard()
			sh.allowed.Add(1)
			sh.waited.Add(1)
			next.ServeHTTP(w, r)
			return
		} else if r.Context().Err() != nil {
			m.fail(w, r, next, err) // the client gave up: no denial to tell
			return
		}
	}
	den := denial(r, checks, &d, m.shadow)
	if m.shadow {
		m.shard().shadowDenied.Add(1)
		if m.onDenied != nil {
			m.onDenied(den)
		}
		next.ServeHTTP(w, r)
		return
	}
	m.shard().denied.Add(1)
	w.Header()["Retry-After"] = []string{itoa(den.RetryAfterSeconds())}
	if m.onDenied != nil {
		m.onDenied(den)
	}
	m.denyResp(w, r, den)
}

// wait waits for the tokens of checks, which a decision has just denied,
// until Config.MaxWait after the request arrived at most, and within r's
// context (Limiter.WaitAll).
func (m *Middleware) wait(r *http.Request, checks []hybrid.Check, arrived time.Time) error {
	ctx, cancel := context.WithDeadline(r.Context(), arrived.Add(m.maxWait))
	defer cancel()
	return m.lim.WaitAll(ctx, checks...)
}

// checksFor returns the checks of r, appended to buf for the single tier,
// with the keys the Limiter is asked about.
func (m *Middleware) checksFor(r *http.Request, buf []hybrid.Check) ([]hybrid.Check, error) {
	if m.checks == nil {
		key, err := m.key(r)
		if err != nil {
			return nil, fmt.Errorf("httplimit: tier %q: %w", m.name, err)
		}
		if key == "" {
			return nil, fmt.Errorf("httplimit: tier %q: %w", m.name, ErrNoKey)
		}
		if key, err = BucketKey(m.keyPrefix + key); err != nil {
			return nil, err
		}
		var cost int64 = 1
		if m.cost != nil {
			if cost = m.cost(r); cost == 0 {
				cost = 1
			}
		}
		return append(buf, hybrid.Check{Tier: m.name, Key: key, Limit: m.limit, Cost: cost}), nil
	}
	checks, err := m.checks(r)
	if err != nil {
		return nil, fmt.Errorf("httplimit: checks: %w", err)
	}
	checks, err = PrepareChecks(checks)
	if err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	return checks, nil
}

// PrepareChecks returns checks as the middleware decides them: each key
// made a bucket key (BucketKey), each check without a Tier named ("default"
// for a lone check, else "tier0", "tier1", ...). It copies checks before it
// changes one, since the caller's slice may be shared. An error names the
// tier whose key is invalid. It is exported for the integrations of other
// protocols (package grpclimit), which prepare checks as httplimit does.
func PrepareChecks(checks []hybrid.Check) ([]hybrid.Check, error) {
	copied := false
	for i := range checks {
		c := &checks[i]
		key, err := BucketKey(c.Key)
		if err != nil {
			return nil, fmt.Errorf("tier %q: %w", c.Tier, err)
		}
		tier := c.Tier
		if tier == "" {
			tier = defaultTier(i, len(checks))
		}
		if key != c.Key || tier != c.Tier {
			if !copied {
				checks = append([]hybrid.Check(nil), checks...)
				copied = true
			}
			checks[i].Key, checks[i].Tier = key, tier
		}
	}
	return checks, nil
}

// defaultTier names the i-th of n checks when it has no name.
func defaultTier(i, n int) string {
	if n == 1 {
		return "default"
	}
	return "tier" + itoa(int64(i))
}

// fail answers a request that could not be decided; in Shadow mode it
// serves it.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	m.shard().errors.Add(1)
	if m.shadow {
		next.ServeHTTP(w, r)
		return
	}
	m.errResp(w, r, err)
}

// denial describes the denial d of r.
func denial(r *http.Request, checks []hybrid.Check, d *hybrid.Decision, shadow bool) Denial {
	c := &checks[d.Denied]
	res := d.Results[d.Denied]
	return Denial{
		Request:    r,
		Tier:       c.Tier,
		Key:        c.Key,
		Limit:      c.Limit,
		Cost:       costOf(c),
		Remaining:  res.Remaining,
		RetryAfter: res.RetryAfter,
		Shadow:     shadow,
	}
}

// costOf returns the cost of c, 0 meaning 1.
func costOf(c *hybrid.Check) int64 {
	if c.Cost == 0 {
		return 1
	}
	return c.Cost
}

// ErrorStatus returns the status with which WriteError answers a request
// that err kept from being decided:
//
//   - 400 Bad Request for a request the limit cannot apply to: no key
//     (ErrNoKey, hybrid.ErrInvalidKey) or a cost that can never be met
//     (hybrid.ErrInvalidCost: negative, or above the burst);
//   - 503 Service Unavailable for a closed Limiter (hybrid.ErrClosed) and
//     a request whose context ended while it waited for Redis;
//   - 500 Internal Server Error for anything else: an invalid limit from
//     Config.Checks, an error of a KeyFunc or of Config.Checks.
//
// A Redis failure is never among them: the Limiter answers through its
// fallback policy instead.
func ErrorStatus(err error) int {
	switch {
	case errors.Is(err, ErrNoKey), errors.Is(err, hybrid.ErrInvalidKey), errors.Is(err, hybrid.ErrInvalidCost):
		return http.StatusBadRequest
	case errors.Is(err, hybrid.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
