package runner

import (
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds the body of a /json request: gRPC's default bound of
// a received message.
const maxJSONBody = 4 << 20

// mainHandler returns the handler of the main HTTP port: /healthcheck,
// /json and /metrics.
func (s *Service) mainHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthcheck", s.health)
	mux.HandleFunc("/json", s.serveJSON)
	mux.Handle("GET /metrics", metricsHandler(reg, s.log))
	return mux
}

// metricsHandler returns the handler of /metrics.
func metricsHandler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
}

// serveJSON answers a ShouldRateLimit request given as JSON (protojson),
// in any method, as the original's /json does: 200 and the response as
// JSON when the request may go, 429 when it is over the limit, 500 for
// the UNKNOWN code, and 400 with no JSON for a body that is not a request
// or a call that fails (an empty domain, no configuration, and also, here,
// a call whose context ended or that came while the service was stopping).
// The request's context bounds the decision: a client that goes away
// stops its wait for Redis.
func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		s.jsonError(w, http.StatusBadRequest, err)
		return
	}
	var req rlspb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		s.jsonError(w, http.StatusBadRequest, err)
		return
	}
	resp, err := s.srv.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		s.jsonError(w, http.StatusBadRequest, err)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		s.jsonError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch resp.GetOverallCode() {
	case rlspb.RateLimitResponse_OVER_LIMIT:
		w.WriteHeader(http.StatusTooManyRequests)
	case rlspb.RateLimitResponse_UNKNOWN:
		w.WriteHeader(http.StatusInternalServerError)
	}
	w.Write(out)
}

// jsonError answers a /json request with code and its text, and logs why
// at debug level (a client can send any number of bad requests).
func (s *Service) jsonError(w http.ResponseWriter, code int, err error) {
	s.log.Debug("/json request refused", "status", code, "err", err)
	http.Error(w, http.StatusText(code), code)
}

// debugEndpoint is one page of the debug port.
type debugEndpoint struct {
	path, help string
	h          http.HandlerFunc
}

// debugHandler returns the handler of the debug port, with the original's
// pages: /rlconfig (the configuration in force, config.Rules.Dump),
// /stats (expvar), the pprof pages, and at / (and any other path) the list
// of them. They are listed in the order of their paths.
func (s *Service) debugHandler() http.Handler {
	endpoints := []debugEndpoint{
		{"/debug/pprof/", "root of various pprof endpoints. hit for help.", pprof.Index},
		{"/debug/pprof/cmdline", "the command line", pprof.Cmdline},
		{"/debug/pprof/profile", "CPU profiling endpoint", pprof.Profile},
		{"/debug/pprof/symbol", "symbol lookup", pprof.Symbol},
		{"/debug/pprof/trace", "trace endpoint", pprof.Trace},
		{"/rlconfig", "print out the currently loaded configuration for debugging", s.serveRLConfig},
		{"/stats", "print out stats", serveExpvar},
	}
	mux := http.NewServeMux()
	for _, e := range endpoints {
		mux.HandleFunc(e.path, e.h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		for _, e := range endpoints {
			fmt.Fprintf(w, "%s: %s\n", e.path, e.help)
		}
	})
	return mux
}

// serveRLConfig writes the configuration in force, one limit a line, or
// nothing if none is loaded.
func (s *Service) serveRLConfig(w http.ResponseWriter, _ *http.Request) {
	if r := s.rules.Load(); r != nil {
		io.WriteString(w, r.Dump())
	}
}

// serveExpvar writes the published variables, one a line.
func serveExpvar(w http.ResponseWriter, _ *http.Request) {
	expvar.Do(func(kv expvar.KeyValue) {
		fmt.Fprintf(w, "%s: %s\n", kv.Key, kv.Value)
	})
}

// newHTTPServer returns an HTTP server of h that logs its errors to log.
// It sets no write timeout: a CPU profile takes 30 s.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
