package rls

import (
	"math"
	"strconv"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The codes of a response.
const (
	codeOK   = rlspb.RateLimitResponse_OK
	codeOver = rlspb.RateLimitResponse_OVER_LIMIT
)

// respond builds the response to the decided request r, and counts it.
// The overall code is OVER_LIMIT if an enforced descriptor is over its
// limit, or if the request has quota-mode descriptors and every one of them
// is (a shadow-mode one never is), as the original decides it; then OK if
// Config.ShadowMode says so.
func (s *Server) respond(r *request) *rlspb.RateLimitResponse {
	// The messages of the statuses, in three arrays rather than three
	// allocations a descriptor.
	nlimited := 0
	for i := range r.items {
		if r.items[i].kind == limited {
			nlimited++
		}
	}
	var (
		sts    = make([]rlspb.RateLimitResponse_DescriptorStatus, len(r.items))
		limits = make([]rlspb.RateLimitResponse_RateLimit, nlimited)
		resets = make([]durationpb.Duration, nlimited)
	)
	resp := &rlspb.RateLimitResponse{
		Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(r.items)),
	}
	over := false
	quotas, quotasOver := 0, 0
	for i := range r.items {
		it, st := &r.items[i], &sts[i]
		resp.Statuses[i] = st
		switch it.kind {
		case noLimit:
			st.Code = codeOK
		case unlimited:
			st.Code, st.LimitRemaining = codeOK, math.MaxUint32
		case limited:
			it.status(st, &limits[0], &resets[0])
			limits, resets = limits[1:], resets[1:]
			switch {
			case it.quota:
				quotas++
				if st.Code == codeOver {
					quotasOver++
				}
			case st.Code == codeOver:
				over = true
			}
			if s.obs != nil {
				s.obs.Hits(it.m.StatsKey(), it.counted(s.nearRatio))
			}
		}
	}
	over = over || quotas > 0 && quotasOver == quotas
	if s.headers != nil {
		resp.ResponseHeadersToAdd = s.headerValues(r, resp.Statuses)
	}
	sh := s.shard()
	sh.requests.Add(1)
	resp.OverallCode = codeOK
	switch {
	case over && s.shadow:
		sh.globalShadow.Add(1)
	case over:
		resp.OverallCode = codeOver
		sh.overLimit.Add(1)
	}
	return resp
}

// status fills st, the status of a limited descriptor, with lim and reset
// for its current_limit and duration_until_reset: over its limit unless it
// is in shadow mode, its limit as configured (or as Envoy overrode it),
// what remains of it and when it is full again.
func (it *item) status(st *rlspb.RateLimitResponse_DescriptorStatus, lim *rlspb.RateLimitResponse_RateLimit, reset *durationpb.Duration) {
	st.Code = codeOK
	if it.over && !it.shadow {
		st.Code = codeOver
	}
	l := &it.m.Limit
	lim.Name = l.Name
	lim.RequestsPerUnit = l.RequestsPerUnit
	lim.Unit = rlspb.RateLimitResponse_RateLimit_Unit(l.Unit)
	st.CurrentLimit = lim
	st.LimitRemaining = uint32(min(max(it.remaining, 0), math.MaxUint32))
	reset.Seconds = resetSeconds(it.reset)
	st.DurationUntilReset = reset
}

// resetSeconds is duration_until_reset for a bucket full again in d:
// whole seconds, rounded up, as the original gives it (the end of its
// window) and as Envoy reads it (its RateLimit-Reset header takes the
// seconds alone): a bucket short of even a fraction of a request says 1 s,
// not 0.
func resetSeconds(d time.Duration) int64 {
	return int64((max(d, 0) + time.Second - 1) / time.Second)
}

// counted is what the request did to its limit, in the original's terms
// (Hits), with nearRatio the near-limit threshold's share of the limit.
// It reads the limit as used: what the bucket lacked before the request,
// in requests, stands for the original's count in the window before it.
func (it *item) counted(nearRatio float32) Hits {
	if it.refund {
		return Hits{}
	}
	n := uint64(it.b.n)
	h := it.hits
	used := uint64(min(max(it.b.n-it.before, 0), it.b.n)) // the original's count before the request
	after := used + h
	near := uint64(math.Floor(float64(float32(n) * nearRatio)))
	hs := Hits{Total: h}
	if it.over {
		if used >= n || after <= n {
			hs.OverLimit = h
		} else {
			hs.OverLimit = after - n
			hs.NearLimit = n - max(near, used)
		}
		if it.shadow {
			hs.ShadowMode = hs.OverLimit
		}
		return hs
	}
	hs.WithinLimit = h
	if after > near {
		if used >= near {
			hs.NearLimit = h
		} else {
			hs.NearLimit = after - near
		}
	}
	return hs
}

// headerValues returns the headers of Config.Headers for the statuses of
// r, chosen as the original chooses: the last status over its limit that is
// not in quota mode, else the first with the fewest remaining among those
// with a limit. It returns nil when no status has a limit. The reset header
// is that status's duration_until_reset, where the original gives the end
// of its unit's window.
func (s *Server) headerValues(r *request, statuses []*rlspb.RateLimitResponse_DescriptorStatus) []*corepb.HeaderValue {
	var pick *rlspb.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range statuses {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, least = st, st.LimitRemaining
		}
		if st.Code == codeOver && !r.items[i].quota {
			pick, least = st, 0
		}
	}
	if pick == nil {
		return nil
	}
	return []*corepb.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(pick.DurationUntilReset.GetSeconds(), 10)},
	}
}
