package global

import (
	"context"
	"fmt"
)

// Load puts the settlement script (lua.Settle) into Redis's script cache,
// into every node's on a Redis Cluster (through the client's ScriptLoad),
// opening a connection to each on the way, so that the first Settle calls
// find the script their hash names, rather than have a Redis that has not
// run it since it started answer NOSCRIPT, and send the source in a round
// trip more (see Settle). A node that joins later, or a Redis that
// restarts or fails over, still answers a first call NOSCRIPT, and that
// call is sent again with the source, as without Load. Load is optional;
// it returns Redis's error, if any.
func (l *Limiter) Load(ctx context.Context) error {
	if err := l.script.Load(ctx, l.rdb).Err(); err != nil {
		return fmt.Errorf("global: load the settlement script: %w", err)
	}
	return nil
}
