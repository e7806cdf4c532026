package rls_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// blackHole listens on a free loopback port, accepts connections and
// never answers: a Redis that hangs. It stops when t ends.
func blackHole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex // protects conns
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis.Addr().String()
}

// TestDeadline checks that the caller's deadline bounds a request: with
// Redis hanging, a Limiter that would wait 5 s for it, and a breaker whose
// calls time out after 10 s, a call with a 200 ms deadline ends with
// DeadlineExceeded, and its handler returns at the deadline, not when
// Redis would have answered. (A ColdWait below the call timeout makes a
// request hand its round trip to the Limiter's flushers and wait for it
// within its context; with a ColdWait at or above the call timeout, as by
// default, a request may send the call itself and wait for it up to the
// call's timeout, whatever its context says.)
func TestDeadline(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: blackHole(t), MaxRetries: -1, ContextTimeoutEnabled: true})
	lim, err := hybrid.New(rdb, hybrid.Config{Instances: 1, Breaker: slowRedis, ColdWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The client first: its connections close, and the calls under
		// way, which Close would wait for, end at once.
		rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		lim.Close(ctx)
	})
	srv := newServer(t, lim, rls.NewRules(load(t, anotherYAML)), rls.Config{})
	type ended struct {
		took time.Duration
		code codes.Code
	}
	handled := make(chan ended, 1)
	timing := func(ctx context.Context, r any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, r)
		handled <- ended{time.Since(start), status.Code(err)}
		return resp, err
	}
	c := serve(t, srv, timing)

	const deadline = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err = c.ShouldRateLimit(ctx, req("another", desc("key3", "cold")))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("ShouldRateLimit: %v, want DeadlineExceeded", err)
	}
	select {
	case e := <-handled:
		// The server's context ends at the deadline it was sent, or
		// when the client, at its own, cancels the call: either may come
		// first.
		if e.code != codes.DeadlineExceeded && e.code != codes.Canceled {
			t.Errorf("handler ended with %v, want DeadlineExceeded or Canceled", e.code)
		}
		if e.took > deadline+2*time.Second {
			t.Errorf("handler took %v, want about the deadline %v", e.took, deadline)
		}
		t.Logf("handler returned after %v", e.took)
	case <-time.After(5 * time.Second):
		t.Fatalf("handler still running 5 s after the deadline of %v", deadline)
	}
	if st := srv.Stats(); st.Unanswered != 1 || st.Requests != 0 {
		t.Errorf("Stats() = %+v, want 1 unanswered", st)
	}
	// A request that needs no Redis is answered, deadline or not.
	ctx, cancel = context.WithTimeout(context.Background(), deadline)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req("another", desc("unknown", "x")))
	if err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		t.Errorf("no limit: %v, %v; want OK", resp, err)
	}
	<-handled
}
