package rls

import (
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// bucket is how a limit of n requests per unit is kept in the Limiter: a
// token bucket of rate n/unit and burst n, in which a request of h hits
// takes h*scale tokens.
type bucket struct {
	limit hybrid.Limit
	// scale is the tokens of one request: 1, or more for a limit the
	// Limiter would not refill exactly otherwise (see bucketOf).
	scale int64
	// n is the requests the bucket holds, the configured requests_per_unit
	// up to maxRequests.
	n int64
}

// maxRequests is the largest burst, in the Limiter's terms
// (hybrid.Limit's bounds): a requests_per_unit above it is served as if it
// were maxRequests.
const maxRequests = 1_000_000_000

// bucketOf returns the bucket of a limit of n requests (n > 0) per unit
// (a valid unit) in mode.
//
// The Limiter keeps a rate as whole micro-tokens a second, so a limit of n
// requests per unit, as a bucket of n tokens, would refill off by up to
// half a micro-token a second: 1 per day (11.57 micro-tokens a second) 4%
// too fast, 5 per day 5 s early of a day, and 1 per year (0.03) not at all.
// So a request takes scale tokens of a bucket of n*scale, refilled at
// n*scale per unit, where scale is the smallest number that makes the rate
// a whole number of micro-tokens a second whatever n is: the unit's
// seconds over their greatest common divisor with 1,000,000 (1 for a
// second, 3 for a minute, 9 for an hour, 27 for a day, 378 for a week, 324
// for a month, 3942 for a year). The limit is the same, in requests, and
// kept exactly. The scale follows the unit alone, not n, so that a reload
// that changes a limit finds the bucket of the descriptor (keyed by its
// unit, not its limit) in the units it was kept in: what it spent carries
// over, as the original's counter does. 3942 is below the Limiter's
// default lease (hybrid.Config.LocalCapacity, 4096), so that a lease holds
// a request of any limit. A limit whose n*scale would be above maxRequests
// takes a smaller scale, and refills fast enough to be kept within a
// hundred-millionth.
func bucketOf(n uint32, unit config.Unit, mode hybrid.Mode) bucket {
	secs := int64(unit.Duration() / time.Second)
	reqs := min(int64(n), maxRequests)
	scale := secs / gcd(secs, 1_000_000) // n*scale a multiple of it for every n
	if reqs*scale > maxRequests {
		scale = max(1, maxRequests/reqs)
	}
	return bucket{
		limit: hybrid.Limit{Rate: float64(reqs*scale) / float64(secs), Burst: reqs * scale, Mode: mode},
		scale: scale,
		n:     reqs,
	}
}

// gcd returns the greatest common divisor of a and b, both above 0.
func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// modeOf returns the settlement mode of a limit whose rate_limit says m,
// def if it says none.
func modeOf(m config.Mode, def hybrid.Mode) hybrid.Mode {
	switch m {
	case config.ModeLease:
		return hybrid.Lease
	case config.ModeOptimistic:
		return hybrid.Optimistic
	case config.ModeExact:
		return hybrid.Exact
	}
	return def
}
