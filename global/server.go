package global

import (
	"context"
	"fmt"
	"strings"
)

// Server returns the name of the Redis server process that answers for
// the fleet set: its run_id (INFO server), which a replica promoted in its
// place and a restart change, and a connection that broke and was made
// again to the same process keeps. It tells a failover behind one address
// (Sentinel's master, a managed Redis's primary endpoint) from a network
// that failed for a while: after the second, nothing this instance wrote
// was lost; after the first, what the dead master had not yet sent its
// replica (or a restarted one had not yet written to disk) may be.
//
// It returns "" and no error from a server that does not tell (INFO
// refused or renamed, miniredis), and Redis's error if the call fails. On
// a Redis Cluster it asks whichever node the client sends INFO to: tell
// the nodes by their addresses there instead.
func (l *Limiter) Server(ctx context.Context) (string, error) {
	pipe := l.rdb.Pipeline()
	info := pipe.Info(ctx, "server")
	if _, err := pipe.Exec(ctx); err != nil {
		if isReply(err) {
			return "", nil // INFO refused: no identity to tell
		}
		return "", fmt.Errorf("global: server: %w", err)
	}
	return runID(info.Val()), nil
}

// runID returns the run_id field of an INFO server reply, "" if it has
// none.
func runID(info string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
