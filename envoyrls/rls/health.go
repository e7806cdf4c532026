package rls

import (
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// HealthService is the name the original's gRPC health checks report its
// status under; the empty name, the server as a whole, reports the same.
const HealthService = "ratelimit"

// RegisterAll registers s as the RateLimitService of g, with the gRPC
// health service and server reflection, and returns the health server. The
// empty service name and HealthService are SERVING: s answers through Redis
// outages, so, unlike the original, whose health fails while Redis is
// down, nothing here sets them NOT_SERVING. A caller that shuts down calls
// the health server's Shutdown first, so that Envoy's health checks drain
// the instance.
func (s *Server) RegisterAll(g reflection.GRPCServer) *health.Server {
	s.Register(g)
	hs := health.NewServer()
	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return hs
}
