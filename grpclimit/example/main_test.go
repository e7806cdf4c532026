package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid/internal/logbuf"
)

// TestRun: the command on a free loopback port, with its embedded Redis:
// a client's API key gets a bucket per method of -burst calls, the
// metadata comes with every answer, and the command stops in order when
// its context ends.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs logbuf.Buffer
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis-timeout", "10s", "-rate", "0.001", "-burst", "2"}, &logs, ready)
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	for i, st := range []struct {
		key  string
		code codes.Code
		rl   string
	}{
		{"k1", codes.OK, `"per-client";r=1;t=1000`},
		{"k1", codes.OK, `"per-client";r=0;t=2000`},
		{"k1", codes.ResourceExhausted, `"per-client";r=0;t=1000`},
		{"k2", codes.OK, `"per-client";r=1;t=1000`},
	} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", st.key)
		var header metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		if status.Code(err) != st.code {
			t.Errorf("call %d: %v, want %v", i, err, st.code)
		}
		if got := header.Get("ratelimit"); len(got) != 1 || got[0] != st.rl {
			t.Errorf("call %d: ratelimit %q, want %q", i, got, st.rl)
		}
		if got := header.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"per-client";q=2;w=2000` {
			t.Errorf("call %d: ratelimit-policy %q", i, got)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	for _, want := range []string{"msg=serving", "msg=denied", "msg=stopped"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs.String())
		}
	}
}
