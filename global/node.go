package global

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// cluster is what a Redis Cluster client offers to find the node of a key:
// *redis.ClusterClient implements it.
type cluster interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// Spread reports whether the buckets may be on several Redis nodes: whether
// the client is a Redis Cluster client.
func (l *Limiter) Spread() bool {
	_, ok := l.rdb.(cluster)
	return ok
}

// Node returns the address of the Redis Cluster master that holds the
// bucket of key, as the client knows the cluster's layout now: the client's
// own address for the node, such as "127.0.0.1:7000". On any other client
// it returns "". The client loads the layout the first time it is needed,
// within ctx; after that Node does not wait (the client refreshes the
// layout in the background). If the layout cannot be loaded Node returns "".
//
// Node lets a caller keep a circuit breaker per node, so that one master
// failing sends only its own keys to a fallback.
func (l *Limiter) Node(ctx context.Context, key string) string {
	if !l.Spread() {
		return ""
	}
	return l.node(ctx, l.Key(key))
}

// Relayout asks a Redis Cluster client to load the cluster's layout again,
// in the background (go-redis's ClusterClient.ReloadState); it does nothing
// on any other client. go-redis learns that a replica took over a master's
// slots from a MOVED reply or its periodic reload, not from a master that
// refuses connections: a caller whose calls to a node fail asks, so that
// the node's keys go to the new master as soon as the cluster has one.
func (l *Limiter) Relayout() {
	if c, ok := l.rdb.(interface{ ReloadState(ctx context.Context) }); ok {
		c.ReloadState(context.Background())
	}
}

// FleetNode is Node for the fleet count's key (see FleetKey).
func (l *Limiter) FleetNode(ctx context.Context) string {
	return l.node(ctx, l.fleetKey)
}

// node returns the address of the master of the Redis key k, or "".
func (l *Limiter) node(ctx context.Context, k string) string {
	c, ok := l.rdb.(cluster)
	if !ok {
		return ""
	}
	m, err := c.MasterForKey(ctx, k)
	if err != nil || m == nil {
		return ""
	}
	return m.Options().Addr
}
