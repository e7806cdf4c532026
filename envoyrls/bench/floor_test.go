package bench

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The gRPC floor: a RateLimitService that answers every call without
// deciding anything, one OK status a descriptor, as fast as grpc-go lets
// a Go service answer. Put beside the two services under the same load
// (HYBRID_RLS_BENCH_FLOOR=1), it shows how many decisions a second the
// machine leaves to any Go service once the load generator and gRPC have
// taken their share, so that a ratio to the original can be read against
// the most a Go service could reach: what a service spends beyond the
// floor is its own.
//
// It is this test binary started again with envFloorServe set (see
// TestMain), serving on GRPC_HOST:GRPC_PORT as the services do, with the
// server options hybrid-rls uses that bear on the cost of a call (its
// stream workers); it reads no configuration and never calls Redis.

// floorStreamWorkers is hybrid-rls's least number of stream workers
// (runner's minStreamWorkers), which on the bench's machines is the number
// it runs with.
const floorStreamWorkers = 64

// floorLimit is the limit each of the floor's statuses reports: the hot
// descriptor's, so that its answers are the size of the services'.
var floorLimit = &rlspb.RateLimitResponse_RateLimit{
	RequestsPerUnit: hotLimit,
	Unit:            rlspb.RateLimitResponse_RateLimit_SECOND,
}

// floorServer is the floor's RateLimitService.
type floorServer struct {
	rlspb.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK, with a status for each descriptor as a
// service that decides would send it.
func (floorServer) ShouldRateLimit(_ context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	resp := &rlspb.RateLimitResponse{
		OverallCode: rlspb.RateLimitResponse_OK,
		Statuses:    make([]*rlspb.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{
			Code:               rlspb.RateLimitResponse_OK,
			CurrentLimit:       floorLimit,
			LimitRemaining:     hotLimit - 1,
			DurationUntilReset: &durationpb.Duration{Nanos: 100_000},
		}
	}
	return resp, nil
}

// runFloor serves the floor until SIGTERM or SIGINT.
func runFloor() error {
	host := os.Getenv("GRPC_HOST")
	if host == "" {
		host = "127.0.0.1"
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(host, os.Getenv("GRPC_PORT")))
	if err != nil {
		return err
	}
	s := grpc.NewServer(grpc.NumStreamWorkers(uint32(max(floorStreamWorkers, 4*runtime.GOMAXPROCS(0)))))
	rlspb.RegisterRateLimitServiceServer(s, floorServer{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		s.Stop()
	}()
	if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// TestFloorServer: the floor answers every descriptor OK with the hot
// descriptor's limit, and the request as a whole OK.
func TestFloorServer(t *testing.T) {
	req := request("route", "/api")
	req.Descriptors = append(req.Descriptors, req.Descriptors[0])
	resp, err := floorServer{}.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlspb.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 {
		t.Fatalf("ShouldRateLimit() = %v, want OK with 2 statuses", resp)
	}
	for i, st := range resp.GetStatuses() {
		if st.GetCode() != rlspb.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != hotLimit {
			t.Errorf("status %d = %v, want OK at %d a second", i, st, hotLimit)
		}
	}
}
