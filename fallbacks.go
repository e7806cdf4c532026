package hybrid

import (
	"fmt"

	"github.com/hybridlimit/hybrid/local"
)

// Fallback is the policy that decides while Redis is unreachable (the
// breaker is open or probing) for keys whose allowance is spent. The zero
// Fallback is LocalShare. Whatever it admits is recorded and charged to
// Redis when it is back, so nothing spent during an outage is lost; the
// charge sinks a bucket no lower than Config.MaxDebt allows.
type Fallback struct {
	kind  fallbackKind
	limit Limit // for Static
}

type fallbackKind uint8

const (
	localShare fallbackKind = iota
	failOpen
	failClosed
	static
)

// The fallback policies.
var (
	// LocalShare (the default) gives each instance its share of every
	// limit: rate R/N and burst B/N (at least the cost of the request),
	// with N the live instances last counted through Redis (or
	// Config.Instances). A key's share starts from 1/N of what the
	// instance last saw its global bucket hold, refilled at R/N since
	// then, not from a full burst: a fleet whose Redis fails mid-run goes
	// on at the limit's rate rather than admit a burst more. A key whose
	// entry left the store (more keys than Config.MaxKeys) starts where
	// its share stood then, as a bounded ledger remembers it
	// (Stats.Ledger); a key the ledger cannot tell apart from one it had
	// to drop starts from the least the dropped ones might hold, which
	// errs towards denying; a key this instance never saw starts full. An
	// Optimistic key's share is less what this instance admitted for it
	// that Redis has not been charged yet. What the shares admit is charged
	// when Redis is back, with a claim of the refill each share kept by
	// being spent, which the bucket in Redis, seeing none of it, lost at
	// its burst: the bucket ends the outage where it would have had it
	// seen every admission.
	LocalShare = Fallback{kind: localShare}
	// FailOpen admits every request.
	FailOpen = Fallback{kind: failOpen}
	// FailClosed denies every request.
	FailClosed = Fallback{kind: failClosed}
)

// Static returns the policy that applies lim, per instance and per key,
// whatever the key's own limit. lim.Mode is ignored. A key's bucket starts
// full at each outage; one whose entry left the store starts where its
// bucket stood then, as LocalShare's shares do.
func Static(lim Limit) Fallback { return Fallback{kind: static, limit: lim} }

// String names the policy.
func (f Fallback) String() string {
	switch f.kind {
	case localShare:
		return "LocalShare"
	case failOpen:
		return "FailOpen"
	case failClosed:
		return "FailClosed"
	case static:
		return fmt.Sprintf("Static(%v/s, burst %d)", f.limit.Rate, f.limit.Burst)
	}
	return fmt.Sprintf("hybrid.Fallback(%d)", f.kind)
}

// check validates a Static limit.
func (f Fallback) check() error {
	if f.kind == static {
		if _, err := local.NewLimit(f.limit.Rate, f.limit.Burst); err != nil {
			return fmt.Errorf("hybrid: fallback %v: %w", f, err)
		}
	}
	return nil
}
