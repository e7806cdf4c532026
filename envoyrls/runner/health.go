package runner

import (
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// healthState is the Service's health, as /healthcheck and the gRPC health
// service report it: healthy unless it is draining, or, with
// Config.HealthyWithConfig, while no configuration with a domain is in
// force. Redis is not part of it: the Limiter's fallback answers while
// Redis is down. It is safe for concurrent use.
type healthState struct {
	grpc          *health.Server
	requireConfig bool
	draining      atomic.Bool
	noConfig      atomic.Bool
}

// newHealth returns the health of a Service whose gRPC health server is
// hs (registered by rls.Server.RegisterAll, SERVING until told).
func newHealth(hs *health.Server, requireConfig bool) *healthState {
	h := &healthState{grpc: hs, requireConfig: requireConfig}
	if requireConfig {
		h.noConfig.Store(true)
		h.publish()
	}
	return h
}

// ok reports whether the Service is healthy.
func (h *healthState) ok() bool { return !h.draining.Load() && !h.noConfig.Load() }

// configLoaded records that a configuration of domains domains is in
// force.
func (h *healthState) configLoaded(domains int) {
	if !h.requireConfig {
		return
	}
	h.noConfig.Store(domains == 0)
	h.publish()
}

// drain makes the Service unhealthy for good: the gRPC health service
// answers NOT_SERVING from now on, whatever is published after.
func (h *healthState) drain() {
	h.draining.Store(true)
	h.grpc.Shutdown()
}

// publish sets the gRPC health service's statuses to what ok says. After
// drain it changes nothing.
func (h *healthState) publish() {
	st := healthpb.HealthCheckResponse_SERVING
	if !h.ok() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.grpc.SetServingStatus("", st)
	h.grpc.SetServingStatus(rls.HealthService, st)
}

// ServeHTTP answers /healthcheck as the original does: 200 and "OK" when
// healthy, else 500 with an empty body.
func (h *healthState) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if !h.ok() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Write([]byte("OK"))
}
