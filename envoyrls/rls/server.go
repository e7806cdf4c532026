package rls

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// Config configures a Server. A zero field means its documented default,
// so the zero Config serves as the original does by default, but for the
// differences the package documentation lists.
type Config struct {
	// Mode is the settlement mode of the limits whose rate_limit names
	// none (config.Limit.Mode), and of the limits Envoy sends in a
	// descriptor (its limit override). The zero value is hybrid.Lease.
	Mode hybrid.Mode

	// Independent charges each descriptor of a request on its own, as the
	// original does: a descriptor takes its hits even when another one
	// refuses the request. false decides the descriptors of a request
	// together (hybrid.Limiter.AllowAll): a refused request takes nothing
	// from the others (see the package documentation for shadow-mode and
	// quota-mode descriptors).
	Independent bool

	// ShadowMode is the original's SHADOW_MODE: every request is decided
	// and counted as usual, the statuses of its descriptors say what was
	// decided, and the overall code is OK whatever they say.
	ShadowMode bool

	// QuotaMode is the original's QUOTA_MODE: every limited descriptor is
	// in quota mode, as if its file said quota_mode: a request is refused
	// only when all of them are over their limits.
	QuotaMode bool

	// NearLimitRatio is the original's NEAR_LIMIT_RATIO: the share of a
	// limit past which hits count as near the limit (Hits.NearLimit). 0
	// means 0.8; it must be in [0, 1].
	NearLimitRatio float64

	// Headers, if not nil, adds the original's rate-limit headers to every
	// response (LIMIT_RESPONSE_HEADERS_ENABLED): see Headers. nil adds
	// none.
	Headers *Headers

	// Observer, if not nil, receives the stats of every descriptor, as the
	// original counts them. nil keeps none (Server.Stats is kept anyway).
	Observer Observer
}

// Headers names the response headers Envoy adds for the descriptor closest
// to its limit, as the original's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER
// and LIMIT_RESET_HEADER do. An empty name means the original's default.
type Headers struct {
	// Limit carries the descriptor's requests_per_unit. "" means
	// "RateLimit-Limit".
	Limit string
	// Remaining carries its limit_remaining. "" means
	// "RateLimit-Remaining".
	Remaining string
	// Reset carries its duration_until_reset in whole seconds. ""
	// means "RateLimit-Reset".
	Reset string
}

// defaultNearLimitRatio is the original's NEAR_LIMIT_RATIO default.
const defaultNearLimitRatio = 0.8

// Server is Envoy's rate limit service (envoy.service.ratelimit.v3
// RateLimitService) on a hybrid.Limiter. It is safe for concurrent use.
// Create one with New and serve it with Register.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer

	lim         *hybrid.Limiter
	rules       func() *config.Rules
	mode        hybrid.Mode
	independent bool
	shadow      bool
	quota       bool
	nearRatio   float32 // the original computes with a float32
	headers     *Headers
	obs         Observer
	counters    [nShards]shard
}

// New returns a Server that decides with lim on the rules that rules
// returns for each request: a func such as Rules.Load, so that the
// configuration can be replaced while the Server serves. rules must be
// fast and safe for concurrent use; a nil *config.Rules means none is
// loaded. New reports a nil lim or rules and an invalid Config.
func New(lim *hybrid.Limiter, rules func() *config.Rules, cfg Config) (*Server, error) {
	if lim == nil {
		return nil, errors.New("rls: nil Limiter")
	}
	if rules == nil {
		return nil, errors.New("rls: nil rules")
	}
	if cfg.Mode > hybrid.Exact {
		return nil, fmt.Errorf("rls: Mode %v is not a settlement mode", cfg.Mode)
	}
	ratio := cfg.NearLimitRatio
	if ratio == 0 {
		ratio = defaultNearLimitRatio
	}
	if math.IsNaN(ratio) || ratio < 0 || ratio > 1 {
		return nil, fmt.Errorf("rls: NearLimitRatio %v is outside [0, 1]", cfg.NearLimitRatio)
	}
	s := &Server{
		lim:         lim,
		rules:       rules,
		mode:        cfg.Mode,
		independent: cfg.Independent,
		shadow:      cfg.ShadowMode,
		quota:       cfg.QuotaMode,
		nearRatio:   float32(ratio),
		obs:         cfg.Observer,
	}
	if h := cfg.Headers; h != nil {
		s.headers = &Headers{
			Limit:     cmp.Or(h.Limit, "RateLimit-Limit"),
			Remaining: cmp.Or(h.Remaining, "RateLimit-Remaining"),
			Reset:     cmp.Or(h.Reset, "RateLimit-Reset"),
		}
	}
	return s, nil
}

// Register registers s as the RateLimitService of g (a *grpc.Server).
func (s *Server) Register(g grpc.ServiceRegistrar) {
	rlspb.RegisterRateLimitServiceServer(g, s)
}

// The original's messages for a request it cannot serve, returned as it
// returns them: errors that are no gRPC status, which gRPC sends as
// codes.Unknown with the message.
const (
	msgEmptyDomain     = "rate limit domain must not be empty"
	msgNoDescriptors   = "rate limit descriptor list must not be empty"
	msgNoConfiguration = "no rate limit configuration loaded"
	msgOverrideNoUnit  = "rate limit override of descriptor %d has no unit"
)

// ShouldRateLimit decides a request: each descriptor is looked up in the
// rules, the limits that apply are decided by the Limiter, and the
// response says OVER_LIMIT if the request must be refused. A descriptor
// that no limit applies to is OK. Redis's state never makes it fail: the
// Limiter's fallback decides while Redis is down. Its errors are the
// original's for a request it cannot serve (codes.Unknown: an empty domain,
// no descriptor, no rules loaded), codes.InvalidArgument for a limit
// override without a unit (which the original cannot serve either), the
// context's when ctx ends first (codes.DeadlineExceeded, codes.Canceled),
// and codes.Unavailable once the Limiter is closed.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, s.serviceError(status.Error(codes.Unknown, msgEmptyDomain))
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, s.serviceError(status.Error(codes.Unknown, msgNoDescriptors))
	}
	rules := s.rules()
	if rules == nil {
		return nil, s.serviceError(status.Error(codes.Unknown, msgNoConfiguration))
	}
	r := getRequest()
	defer r.release()
	if err := s.plan(r, rules, req); err != nil {
		return nil, s.serviceError(err)
	}
	var err error
	if s.independent {
		err = s.decideEach(ctx, r.items)
	} else {
		err = s.decideTogether(ctx, r.items)
	}
	if err != nil {
		s.shard().unanswered.Add(1)
		return nil, limiterError(err)
	}
	return s.respond(r), nil
}

// serviceError counts err, an error of the request itself, and returns
// it.
func (s *Server) serviceError(err error) error {
	s.shard().serviceErrors.Add(1)
	return err
}

// limiterError is the status of an error of the Limiter: its context
// ended, or it is closed. Its other errors are misuse, which the Server
// rules out before it asks (a valid key, limit and cost), and never
// Redis's.
func limiterError(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, hybrid.ErrClosed):
		return status.Error(codes.Unavailable, "rls: the limiter is closed")
	}
	return status.Errorf(codes.Internal, "rls: %v", err)
}
