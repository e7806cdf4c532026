package hybrid

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// checkClient logs one warning on log when rdb's options, as far as they can
// be read (a *redis.Client, including a failover client, a
// *redis.ClusterClient or a *redis.Ring), do not let the limiter's call
// deadlines reach the socket: without ContextTimeoutEnabled, go-redis waits
// for a Redis that does not answer until its own ReadTimeout (3 s by
// default), not the breaker's call timeout, so rounds stall and the breaker
// trips late. Retries (MaxRetries) are safe: a settlement the client sends
// again is either numbered, and applied once, or a decision that, applied
// twice, errs towards denying (docs/failure.md).
func checkClient(rdb redis.UniversalClient, log *slog.Logger) {
	ctxTimeout := true
	switch c := rdb.(type) {
	case *redis.Client:
		ctxTimeout = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		ctxTimeout = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		ctxTimeout = c.Options().ContextTimeoutEnabled
	}
	if !ctxTimeout && log != nil {
		log.Warn("hybrid: the Redis client's ContextTimeoutEnabled is false: a call to a Redis that does not answer lasts the client's ReadTimeout, not the limiter's call timeout; set ContextTimeoutEnabled: true in the client's options")
	}
}
