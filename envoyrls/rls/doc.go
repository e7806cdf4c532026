// Package rls serves Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService, ShouldRateLimit) on a
// hybrid.Limiter: a drop-in replacement for envoyproxy/ratelimit that reads
// its configuration (package config) and answers with its codes and
// statuses, while the limits are token buckets that hold across a fleet,
// hot descriptors are answered in memory, Redis is settled in batches, and
// an outage of Redis is decided by the Limiter's fallback rather than
// failed.
//
//	rules := rls.NewRules(loaded)                  // a *config.Rules
//	srv, err := rls.New(lim, rules.Load, rls.Config{})
//	...
//	g := grpc.NewServer()
//	srv.RegisterAll(g)                             // the service, health and reflection
//	g.Serve(lis)
//	...
//	rules.Store(reloaded)                          // a new configuration, while serving
//
// # A request
//
// Each descriptor of a request is looked up in the rules of its domain
// (config.Rules.Lookup, or config.Rules.Override when Envoy sends a limit
// with the descriptor). A descriptor that matches no limit, or whose domain
// no file configures, is OK with no current_limit, and an unlimited one OK
// with limit_remaining 4294967295 and no current_limit, as the original
// answers them; the Limiter is not asked about either. A limit named in
// the replaces of another limit matched by the same request is dropped,
// as in the original: that descriptor is OK with no current_limit, and its
// bucket is left alone. The overall code is OVER_LIMIT if a descriptor is
// over its limit, but for those in shadow or quota mode (below).
//
// A limit of N requests per unit is a token bucket of rate N/unit and
// burst N (hybrid.Limit), settled in the mode its rate_limit names (the
// mode field, this project's own: see package config), else Config.Mode,
// lease by default. A request may take several tokens of a bucket scaled
// to match (by its unit alone, at most 3942 tokens for a year), so that
// the Limiter, which keeps rates in whole micro-tokens a second, refills
// every limit exactly (1 per day would refill 4% too fast otherwise, and 1
// per year not at all), and a reload that changes the limit finds its
// bucket in the units it was kept in. A request
// costs its hits_addend: the descriptor's own if it has one, else the
// request's, 0 meaning 1, as in the original.
//
// The bucket of a descriptor is keyed by its domain, the unit of its limit
// and its entries, keys and values as sent, as the original keys its
// counters: a descriptor matched by its key alone, or by a wildcard,
// counts each value apart, and one matched by a wildcard with
// share_threshold shares a bucket across the values the wildcard matches.
// The encoding is injective (separators inside keys and values are
// escaped), and a key longer than 256 bytes is replaced by 128 bits of its
// SHA-256 (with its first 64 bytes, for a reader of Redis), so that any
// value is limited, and no client can aim at another client's bucket.
//
// Each limited descriptor's status has its code, its current_limit
// (requests_per_unit, unit, and the rate_limit's name), its
// limit_remaining (whole requests left, as this instance knows the bucket:
// hybrid.Result.Remaining) and its duration_until_reset: how long until the
// bucket is full again, in whole seconds, rounded up. The original gives
// the time until its window ends, when the whole limit is there again;
// with a token bucket that moment is when the bucket is full, so that
// limit, remaining and reset keep saying what Envoy's RateLimit headers
// (and the original's) say with them: after reset, limit requests can go.
// The time until the next request could go is shorter (the bucket refills
// a request every unit/N), but a client that waits as long as reset says
// finds the whole limit there again, unless others spent it meanwhile, as
// with the original. The value is never more than the unit, as with the
// original, and whole seconds because Envoy reads the seconds alone.
//
// # All or nothing
//
// By default the descriptors of a request are decided together
// (hybrid.Limiter.AllowAll): the request takes the hits of every limit, or,
// if one of them refuses it, of none. The original charges every
// descriptor of every request, even when another refuses it, so that a
// request refused by one limit still spends the others. Config.Independent
// keeps its way: each descriptor is decided on its own and takes its hits
// if its limit has them. In both, a descriptor over its limit takes
// nothing (a token bucket refuses without spending), where the original
// counts the refused hits too, so that its counter runs past the limit.
// A descriptor whose hits a refusal gave back, or left undecided because
// an earlier one refused the request, is read (hybrid.Limiter.Peek) for
// its status.
//
// Shadow mode (shadow_mode: true) makes a descriptor OK whatever its limit
// says; what it would have refused is counted (Hits.ShadowMode). All or
// nothing, a shadow descriptor is not part of the decision, so that it
// never refuses a request, alone or by taking the others' tokens: it takes
// its hits only when the request goes ahead, and is read otherwise. Its
// bucket so counts the requests that passed the enforced limits, what it
// would count were it enforced. Config.ShadowMode is the original's
// SHADOW_MODE: every request is decided and charged as usual, the statuses
// say what was decided, and the overall code is OK (Stats.GlobalShadowMode
// counts the responses it turned).
//
// Quota mode (quota_mode: true, or Config.QuotaMode for every descriptor,
// the original's QUOTA_MODE) refuses a request only when every quota-mode
// descriptor of it is over its limit, as in the original. All or nothing,
// quota-mode descriptors are charged each on its own, as in the original,
// before the others are decided together: a request that the others then
// refuse has spent them.
//
// A check (a descriptor's own hits_addend of 0) takes nothing and is over
// its limit if one more request would be; a request of more hits than its
// limit holds is over it, and a limit of 0 requests refuses every one. All
// or nothing, they are decided first: one over refuses the request before
// anything is taken.
//
// # Errors and deadlines
//
// The errors are the original's for a request it cannot serve, with its
// messages and its code (codes.Unknown, as gRPC sends an error that is no
// status): an empty domain, no descriptor, no rules loaded. A limit
// override without a unit is codes.InvalidArgument (the original's process
// fails on it). Redis never makes a request fail: while it is down, the
// Limiter's fallback policy decides (hybrid.Config.Fallback), and the
// outage's consumption is charged when it is back; the original answers
// with Redis's error, and Envoy's failure_mode_deny decides.
//
// The call's context, which carries Envoy's deadline, bounds every wait
// for Redis: a request still waiting when it ends fails with
// codes.DeadlineExceeded (or codes.Canceled), which Envoy reads as an
// error of the service. A decision waits for Redis at most the Limiter's
// ColdWait (hybrid.Config.ColdWait, by default the breaker's call timeout,
// 50 ms), and only for a descriptor this instance holds nothing for: set
// Envoy's timeout for the service (20 ms by default) above it, or ColdWait
// below Envoy's. With a ColdWait at or above the breaker's call timeout, a
// request may carry its own round trip to Redis, and then waits for that
// call's timeout (which adapts to Redis's latency, up to
// breaker.Config.MaxCallTimeout) rather than for its context.
//
// # Stats
//
// Config.Observer receives, for every limited descriptor of a request,
// what the original counts under its stats key (config.Match.StatsKey):
// total_hits, over_limit, near_limit (with NEAR_LIMIT_RATIO,
// Config.NearLimitRatio), within_limit and shadow_mode, computed from the
// bucket as this instance knew it; and domain_not_found. Counters keeps
// them in memory. Server.Stats counts the calls. Config.Headers adds the
// original's rate-limit headers (LIMIT_RESPONSE_HEADERS_ENABLED), whose
// reset is the chosen descriptor's duration_until_reset.
//
// # Left out
//
// The original's dynamic metadata (RESPONSE_DYNAMIC_METADATA), its
// quota status field, its local over-limit cache and per-second Redis
// (the Limiter answers hot descriptors in memory), and
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (all or nothing does what it
// approximates). A descriptor with is_negative_hits, which asks for tokens
// back, takes nothing and is never over: the Limiter cannot add tokens,
// and the original, which does not know the field, charges it. A
// requests_per_unit above 1,000,000,000 is served as 1,000,000,000, the
// Limiter's largest burst. The health service is SERVING through Redis
// outages (RegisterAll), where the original's fails.
package rls
