package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// CheckLoopback returns an error unless addr is host:port with a loopback IP
// or "localhost" as host.
func CheckLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("redistest: address %q: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("redistest: address %q: bad port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("redistest: address %q is not a loopback address", addr)
}

// LoopbackDialer returns a go-redis Dialer that dials like go-redis's own,
// with the given connect timeout, but refuses any address that is not a
// loopback one (including addresses a Redis Cluster announces).
func LoopbackDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := CheckLoopback(addr); err != nil {
			return nil, err
		}
		d := net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
		return d.DialContext(ctx, network, addr)
	}
}

// Each is a go-redis hook that calls itself with every command sent, each
// command of a pipeline or transaction apart, before it goes: a test's
// own count of the commands it cares for. It must be safe for concurrent
// use.
type Each func(cmd redis.Cmder)

// DialHook passes dials through.
func (f Each) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook calls f with the command.
func (f Each) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook calls f with every command of a pipeline.
func (f Each) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			f(cmd)
		}
		return next(ctx, cmds)
	}
}

// Counter is a go-redis hook that counts the commands sent, each command of
// a pipeline or transaction apart. The zero Counter is ready to use and safe
// for concurrent use.
type Counter struct {
	n atomic.Int64
}

// Load returns the commands counted so far.
func (c *Counter) Load() int64 { return c.n.Load() }

// DialHook passes dials through.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
