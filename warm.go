package hybrid

import (
	"context"
	"fmt"
)

// Warm readies Redis for this Limiter's first decisions, which would
// otherwise wait for what a new process does once: it loads the
// settlement script into Redis's script cache (every node's, on a Redis
// Cluster) and opens a connection to each node on the way. Without it, a
// process's first cold decision on a connection pays for the dial and, on a
// Redis that has not run the script since it started, for a NOSCRIPT reply
// and the script's source; across a network of a few milliseconds that
// is a few round trips, which may outlast ColdWait (docs/tuning.md, "The
// cold path across a network"). A service calls it before it reports
// itself ready; it is optional, and the Limiter works without it. It
// returns Redis's error, if any, and waits no longer than ctx.
func (l *Limiter) Warm(ctx context.Context) error {
	if err := l.g.Load(ctx); err != nil {
		return fmt.Errorf("hybrid: warm: %w", err)
	}
	return nil
}
