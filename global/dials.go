package global

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// WatchDials has gone called with a node's address each time the client
// rdb dials a Redis node and the network says that the node is gone (see
// Gone): a Redis that is down, not slow. go-redis dials again, with a
// pause, until the call's deadline, and then reports only that the
// deadline passed, so that the evidence would otherwise be lost.
//
// The address is the node's on a *redis.ClusterClient (the nodes the client
// makes from now on: go-redis has no hook into the dials of a node it made
// already), and "" on a *redis.Client, a failover client among them, whose
// dial finds the master through its sentinels. A client of another type,
// a *redis.Ring among them (its hooks do not reach its shards' dials), is
// not watched: its breakers open on silence alone.
//
// The hook stays on the client, which has no way to remove it: stop makes
// it inert, and drops gone.
func WatchDials(rdb redis.UniversalClient, gone func(addr string)) (stop func()) {
	w := &dialWatch{}
	w.gone.Store(&gone)
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(node *redis.Client) { node.AddHook(dialHook{w: w, addr: node.Options().Addr}) })
	case *redis.Client:
		c.AddHook(dialHook{w: w})
	}
	return w.stop
}

// dialWatch is what WatchDials's hooks report to: gone, until stop.
type dialWatch struct {
	gone atomic.Pointer[func(addr string)]
	once sync.Once
}

func (w *dialWatch) stop() { w.once.Do(func() { w.gone.Store(nil) }) }

// dialHook is a redis.Hook that passes dials through and tells w of those
// that found the node gone.
type dialHook struct {
	w    *dialWatch
	addr string // the node's; "" but on a Redis Cluster
}

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && Gone(err) {
			if f := h.w.gone.Load(); f != nil {
				(*f)(h.addr)
			}
		}
		return conn, err
	}
}

func (h dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Gone reports whether err, a dial's error, is the network saying that
// the Redis node is gone: the connection refused (nothing listens: the
// process died or restarts), reset or aborted while it was being made, or
// no route to the host or its network. A dial that times out is silence,
// which says nothing of whether the node is slow or gone, and so is every
// other error.
func Gone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
}
