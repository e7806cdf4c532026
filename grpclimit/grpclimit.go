// Package grpclimit is gRPC middleware that rate-limits calls with a
// hybrid.Limiter: server interceptors that key each call (by method, by the
// client's address behind trusted proxies, by a metadata value, or by
// anything a function can compute), price it, ask the Limiter about every
// tier at once, report the limits in the response header metadata and
// answer a denied call with codes.ResourceExhausted; and a client
// interceptor that retries a denied call after the delay the server asked
// for.
//
// An Interceptor is built from a Limiter and a Config, and gives the server
// its interceptors:
//
//	rl, err := grpclimit.New(lim, grpclimit.Config{
//		Key:   grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByPeer(nil)),
//		Limit: hybrid.Limit{Rate: 100, Burst: 200},
//	})
//	...
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary()), grpc.ChainStreamInterceptor(rl.Stream()))
//
// A unary call is decided once, before its handler runs; a stream is
// decided once, when it starts, and its messages are not limited.
// Config.Checks replaces the single tier with any number of tiers: a call
// passes only if every tier does, and a denied call consumes nothing in any
// tier (hybrid.Limiter.AllowAll). HTTPChecks lets the rules of package
// policy, or any function of an *http.Request, produce them, since a gRPC
// call is an HTTP/2 POST to its method's path.
//
// Every decided call carries the "ratelimit-policy" and "ratelimit" header
// metadata, the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers as package httplimit formats them.
// A denial is the status ResourceExhausted with the google.rpc RetryInfo
// and QuotaFailure details (Denial.Status), and the grpc-retry-pushback-ms
// trailer that gRPC's own retry policy honours. On the client side,
// Retry.Unary waits for the delay of a denial's RetryInfo (RetryDelay),
// within bounds, and calls again:
//
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(grpclimit.Retry{}.Unary()), ...)
//
// Redis failures never reach the interceptors: the Limiter answers through
// its fallback policy. The errors they can meet are misuse and a closed
// Limiter; ErrorStatus says which status answers each.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Config configures an Interceptor. A zero field means its documented
// default. Set either the single-tier fields (Name, Key, Limit, Cost) or
// Checks.
type Config struct {
	// Name names the single tier: the policy name in the metadata and the
	// QuotaFailure, and the start of its bucket keys. "" means "default".
	// It must be printable ASCII.
	Name string
	// Key keys a call in the single tier. nil means ByPeer(nil): the
	// peer's address, trusting no proxy. The bucket key is Name, a colon
	// and Key's result, so that interceptors sharing a Limiter under
	// different names do not share buckets; a long one is hashed
	// (httplimit.BucketKey).
	Key KeyFunc
	// Limit is the single tier's limit. It is validated by New.
	Limit hybrid.Limit
	// Cost prices a call in the single tier, in tokens. nil means 1 for
	// every call; a result of 0 means 1. A negative cost, or one above the
	// burst, can never be met: the call is answered InvalidArgument
	// (ErrorStatus), never admitted.
	Cost func(ctx context.Context, method string) int64

	// Checks, if not nil, replaces the single tier: it returns the tiers a
	// call is checked against, given the call's context (peer.FromContext
	// and metadata.FromIncomingContext read it) and its full method,
	// "/package.Service/Method". The call passes only if every check does,
	// and then the tokens of every check are taken. An empty slice exempts
	// the call: it is served with no decision and no metadata. An error is
	// answered as ErrorStatus says: wrap ErrNoKey for InvalidArgument.
	// Keys are used as they are, but for the long ones (see Key), and the
	// slice is not modified, so it may be shared. A Check with an empty
	// Tier is named "default" if it is the only one, else "tier" and its
	// index. HTTPChecks adapts the rules of package policy.
	Checks func(ctx context.Context, method string) ([]hybrid.Check, error)

	// MaxWait, if above 0, lets a call over its limit wait up to that long
	// for its tokens, within its own context (hybrid.Limiter.WaitAll),
	// rather than be refused at once: it is then served, or answered
	// ResourceExhausted as usual once its tokens would come later than
	// that (at once, without waiting). A single tier's call takes its
	// tokens ahead of time and sleeps until they are due. For smoothing
	// bursts, not for queueing floods: a waiting call holds its goroutine
	// and stream (Envoy's local rate limit with a queue). 0 refuses at
	// once; a negative MaxWait is an error of New.
	MaxWait time.Duration

	// NoHeaders sends no rate-limit metadata. false sends "ratelimit-policy"
	// and "ratelimit" in the response header of every decided call.
	NoHeaders bool

	// Shadow decides and counts every call, and calls OnDenied, but serves
	// the call whatever the decision: for rolling out a new limit. An
	// error is counted and the call is served too.
	Shadow bool
	// ShadowHeaders sends the rate-limit metadata in Shadow mode as well.
	// false sends none: clients do not slow down for a limit that is not
	// enforced yet.
	ShadowHeaders bool

	// OnDenied, if not nil, is called for every denied call, shadow
	// denials too, before the call is answered (or, in Shadow mode,
	// served), with the call's context. It is called on the call's
	// goroutine with no lock held.
	OnDenied func(ctx context.Context, d Denial)
}

// Denial describes a denied call, for Config.OnDenied.
type Denial struct {
	// Method is the call's full method, "/package.Service/Method".
	Method string
	// Tier names the tier that denied, Key is its bucket key and Limit its
	// limit. The key may hold what the caller identified itself with: it
	// is not sent to the client.
	Tier, Key string
	Limit     hybrid.Limit
	// Cost is the tokens the call asked of that tier.
	Cost int64
	// Remaining is the whole tokens left in that tier.
	Remaining int64
	// RetryAfter estimates how long until the call could pass.
	RetryAfter time.Duration
	// Shadow reports a denial in Shadow mode: the call is served.
	Shadow bool
}

// Stats is a snapshot of an Interceptor's counters.
type Stats struct {
	// Allowed counts the calls that passed every tier.
	Allowed uint64
	// Denied counts the calls denied and answered ResourceExhausted.
	Denied uint64
	// ShadowDenied counts the calls that a tier denied in Shadow mode and
	// that were served.
	ShadowDenied uint64
	// Errors counts the calls that could not be decided (ErrorStatus).
	Errors uint64
	// Exempt counts the calls for which Config.Checks returned no check.
	Exempt uint64
	// Waited counts the calls over their limit that waited for their
	// tokens (Config.MaxWait) and were then served; they are counted in
	// Allowed too. Those whose wait ended without them are in Denied (or
	// Errors, for a call whose context ended).
	Waited uint64
}

// Interceptor rate-limits the calls of a gRPC server: Unary and Stream
// return its server interceptors. It is safe for concurrent use. Create one
// with New.
type Interceptor struct {
	lim *hybrid.Limiter

	// The single tier; checks is nil then.
	name      string
	keyPrefix string // name + ":"
	key       KeyFunc
	limit     hybrid.Limit
	cost      func(context.Context, string) int64
	policy    string // the ratelimit-policy value of the single tier
	checks    func(context.Context, string) ([]hybrid.Check, error)

	maxWait  time.Duration
	headers  bool
	shadow   bool
	onDenied func(context.Context, Denial)
	counters [nShards]shard
}

// nShards is the number of counter shards: concurrent calls mostly update
// different cache lines.
const nShards = 16

// shard is one cache line of counters.
type shard struct {
	allowed, denied, shadowDenied, errors, exempt, waited atomic.Uint64
	_                                                     [128 - 6*8]byte
}

// New returns an Interceptor that decides with lim as cfg says. It reports
// a nil lim, a Config that sets both the single tier and Checks, an invalid
// Limit and a Name that is not printable ASCII.
func New(lim *hybrid.Limiter, cfg Config) (*Interceptor, error) {
	if lim == nil {
		return nil, errors.New("grpclimit: nil Limiter")
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("grpclimit: MaxWait %v is negative", cfg.MaxWait)
	}
	ic := &Interceptor{
		lim:      lim,
		maxWait:  cfg.MaxWait,
		checks:   cfg.Checks,
		headers:  !cfg.NoHeaders && (!cfg.Shadow || cfg.ShadowHeaders),
		shadow:   cfg.Shadow,
		onDenied: cfg.OnDenied,
	}
	if cfg.Checks != nil {
		if cfg.Key != nil || cfg.Cost != nil || cfg.Limit != (hybrid.Limit{}) || cfg.Name != "" {
			return nil, errors.New("grpclimit: Config sets both Checks and the single tier (Name, Key, Limit, Cost)")
		}
		return ic, nil
	}
	ic.name = cfg.Name
	if ic.name == "" {
		ic.name = "default"
	}
	for i := 0; i < len(ic.name); i++ {
		if b := ic.name[i]; b < 0x20 || b > 0x7e {
			return nil, fmt.Errorf("grpclimit: Name %q is not printable ASCII", ic.name)
		}
	}
	if _, err := reconcile.NewSpec(cfg.Limit.Rate, cfg.Limit.Burst, cfg.Limit.Mode); err != nil {
		return nil, fmt.Errorf("grpclimit: Limit %+v: %w", cfg.Limit, err)
	}
	ic.keyPrefix = ic.name + ":"
	ic.key = cfg.Key
	if ic.key == nil {
		ic.key = ByPeer(nil)
	}
	ic.limit = cfg.Limit
	ic.cost = cfg.Cost
	ic.policy = string(httplimit.AppendPolicy(nil, []hybrid.Check{{Tier: ic.name, Limit: cfg.Limit}}))
	return ic, nil
}

// Reset makes the bucket of key full again across the fleet
// (hybrid.Limiter.Reset): an operator unblocking a client, from an admin
// tool or a method of the service's own (the interceptor serves none for
// it). key is what the single tier's Key returns for the caller, or, for an
// Interceptor of Checks, a Check's Key; a long key is hashed as the
// interceptor hashes it. Its errors are Reset's: while Redis is down, one
// wrapping hybrid.ErrUnavailable.
func (ic *Interceptor) Reset(ctx context.Context, key string) error {
	if ic.checks == nil {
		key = ic.keyPrefix + key
	}
	bk, err := httplimit.BucketKey(key)
	if err != nil {
		return err
	}
	return ic.lim.Reset(ctx, bk)
}

// Stats returns a snapshot of ic's counters.
func (ic *Interceptor) Stats() Stats {
	var s Stats
	for i := range ic.counters {
		c := &ic.counters[i]
		s.Allowed += c.allowed.Load()
		s.Denied += c.denied.Load()
		s.ShadowDenied += c.shadowDenied.Load()
		s.Errors += c.errors.Load()
		s.Exempt += c.exempt.Load()
		s.Waited += c.waited.Load()
	}
	return s
}

// shard returns a counter shard, picked at random.
func (ic *Interceptor) shard() *shard {
	return &ic.counters[rand.Uint32()%nShards]
}
