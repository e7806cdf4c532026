package global_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// gones records the addresses WatchDials reports.
type gones struct {
	mu    sync.Mutex
	addrs []string
}

func (g *gones) gone(addr string) {
	g.mu.Lock()
	g.addrs = append(g.addrs, addr)
	g.mu.Unlock()
}

func (g *gones) got() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.addrs...)
}

// TestWatchDials: a dial that the network refuses is reported at once, with
// "" on a client of one Redis and the node's address on a cluster client;
// a dial that times out is not (silence); after stop nothing is.
func TestWatchDials(t *testing.T) {
	ctx := context.Background()
	t.Run("client", func(t *testing.T) {
		var g gones
		rdb := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1})
		defer rdb.Close()
		stop := global.WatchDials(rdb, g.gone)
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("a ping to nothing succeeded")
		}
		if got := g.got(); len(got) != 1 || got[0] != "" {
			t.Fatalf("reported %q, want one \"\"", got)
		}
		stop()
		stop() // idempotent
		rdb.Ping(ctx)
		if got := g.got(); len(got) != 1 {
			t.Fatalf("after stop: reported %q, want nothing more", got)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		var g gones
		addr := redistest.ClosedAddr(t)
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1, DialerRetries: 1})
		defer rdb.Close()
		defer global.WatchDials(rdb, g.gone)()
		rdb.Ping(ctx)
		got := g.got()
		if len(got) == 0 {
			t.Fatal("nothing reported")
		}
		for _, a := range got {
			if a != addr {
				t.Fatalf("reported %q, want only %q", got, addr)
			}
		}
	})
	t.Run("silence", func(t *testing.T) {
		var g gones
		rdb := redis.NewClient(&redis.Options{
			Addr:          "127.0.0.1:1",
			MaxRetries:    -1,
			DialerRetries: 1,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				<-ctx.Done() // a dial nobody answers
				return nil, ctx.Err()
			},
		})
		defer rdb.Close()
		defer global.WatchDials(rdb, g.gone)()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		rdb.Ping(cctx)
		if got := g.got(); len(got) != 0 {
			t.Fatalf("a dial that timed out reported %q, want nothing", got)
		}
	})
}

// TestGone: the errors that say a node is gone, wrapped as net and
// go-redis wrap them, and those that do not.
func TestGone(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}
	}
	for _, err := range []error{op(syscall.ECONNREFUSED), op(syscall.ECONNRESET), op(syscall.EHOSTUNREACH), op(syscall.ENETUNREACH), op(syscall.ECONNABORTED)} {
		if !global.Gone(err) {
			t.Errorf("Gone(%v) = false, want true", err)
		}
	}
	for _, err := range []error{nil, context.DeadlineExceeded, op(syscall.ETIMEDOUT), errors.New("ERR something"), redis.Nil} {
		if global.Gone(err) {
			t.Errorf("Gone(%v) = true, want false", err)
		}
	}
}
