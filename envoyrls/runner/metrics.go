package runner

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
	"github.com/hybridlimit/hybrid/hybridprom"
)

// The metrics of a Service besides the Limiter's (package hybridprom,
// hybrid_*) and the Go runtime's and the process's (go_*, process_*).
// Those named ratelimit_service_* are what the original's Prometheus
// exporter, with its default mapping, names its stats; hybrid_rls_* are
// this service's own.
const (
	metricHits           = "ratelimit_service_rate_limit_total_hits"
	metricOverLimit      = "ratelimit_service_rate_limit_over_limit"
	metricNearLimit      = "ratelimit_service_rate_limit_near_limit"
	metricWithinLimit    = "ratelimit_service_rate_limit_within_limit"
	metricShadowMode     = "ratelimit_service_rate_limit_shadow_mode"
	metricDomainNotFound = "ratelimit_service_rate_limit_domain_not_found"
	metricLoadSuccess    = "ratelimit_service_config_load_success"
	metricLoadError      = "ratelimit_service_config_load_error"
	metricCallErrors     = "ratelimit_service_should_rate_limit_error"
	metricGlobalShadow   = "ratelimit_service_global_shadow_mode"
	metricRequests       = "ratelimit_service_total_requests"
	metricResponseTime   = "ratelimit_service_response_time_seconds"
	metricCalls          = "hybrid_rls_calls_total"
	metricOverResponses  = "hybrid_rls_over_limit_responses_total"
	metricSeries         = "hybrid_rls_stats_series"
	metricDomains        = "hybrid_rls_config_domains"
)

// loads counts the loads of the configuration.
type loads struct {
	success, failure atomic.Uint64
	domains          atomic.Int64 // of the rules in force
}

// collector exports a Service's counters: the per-descriptor stats, the
// configuration loads and the Server's calls.
type collector struct {
	stats *descStats
	loads *loads
	srv   *rls.Server

	hits, over, near, within, shadow, notFound *prometheus.Desc
	loadOK, loadErr, callErrs, globalShadow    *prometheus.Desc
	calls, overResponses, series, domains      *prometheus.Desc
}

// newCollector returns the collector of stats, loads and srv.
func newCollector(stats *descStats, l *loads, srv *rls.Server) *collector {
	byKey := []string{"domain", "key1", "key2"}
	d := prometheus.NewDesc
	return &collector{
		stats: stats, loads: l, srv: srv,
		hits:          d(metricHits, "Hits of the descriptors a limit applied to (the original's total_hits), by domain and the first two levels of the stats key.", byKey, nil),
		over:          d(metricOverLimit, "Hits beyond the limit (over_limit).", byKey, nil),
		near:          d(metricNearLimit, "Hits between NEAR_LIMIT_RATIO of the limit and the limit (near_limit).", byKey, nil),
		within:        d(metricWithinLimit, "Hits of requests the limit did not refuse (within_limit).", byKey, nil),
		shadow:        d(metricShadowMode, "Hits a limit in shadow mode would have refused (shadow_mode).", byKey, nil),
		notFound:      d(metricDomainNotFound, "Descriptors of a domain no file configures, by domain.", []string{"domain"}, nil),
		loadOK:        d(metricLoadSuccess, "Configurations loaded and put in force.", nil, nil),
		loadErr:       d(metricLoadError, "Configurations refused; the one in force was kept.", nil, nil),
		callErrs:      d(metricCallErrors, "Calls refused for the request itself or for want of a configuration (service_error).", []string{"err_type"}, nil),
		globalShadow:  d(metricGlobalShadow, "Responses SHADOW_MODE made OK.", nil, nil),
		calls:         d(metricCalls, "ShouldRateLimit calls (gRPC and /json), by outcome: answered, service_error (the request or the configuration), unanswered (its context ended first, or the service was stopping).", []string{"outcome"}, nil),
		overResponses: d(metricOverResponses, "Responses whose overall code is OVER_LIMIT.", nil, nil),
		series:        d(metricSeries, "Label sets of the ratelimit_service_rate_limit_* metrics, at most -max-series; the hits of the others count under an empty domain.", nil, nil),
		domains:       d(metricDomains, "Domains of the configuration in force.", nil, nil),
	}
}

// Describe sends the descriptions of c's metrics.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.hits, c.over, c.near, c.within, c.shadow, c.notFound,
		c.loadOK, c.loadErr, c.callErrs, c.globalShadow,
		c.calls, c.overResponses, c.series, c.domains,
	} {
		ch <- d
	}
}

// Collect sends c's metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	c.stats.eachSeries(func(s *series) {
		l := s.labels
		counter(c.hits, s.total.Load(), l.domain, l.key1, l.key2)
		counter(c.over, s.over.Load(), l.domain, l.key1, l.key2)
		counter(c.near, s.near.Load(), l.domain, l.key1, l.key2)
		counter(c.within, s.within.Load(), l.domain, l.key1, l.key2)
		counter(c.shadow, s.shadow.Load(), l.domain, l.key1, l.key2)
	})
	c.stats.eachDomain(func(domain string, v uint64) { counter(c.notFound, v, domain) })
	counter(c.loadOK, c.loads.success.Load())
	counter(c.loadErr, c.loads.failure.Load())
	st := c.srv.Stats()
	counter(c.callErrs, st.ServiceErrors, "service_error")
	counter(c.globalShadow, st.GlobalShadowMode)
	counter(c.calls, st.Requests, "answered")
	counter(c.calls, st.ServiceErrors, "service_error")
	counter(c.calls, st.Unanswered, "unanswered")
	counter(c.overResponses, st.OverLimit)
	gauge(c.series, c.stats.series.Load())
	gauge(c.domains, c.loads.domains.Load())
}

// grpcMetrics counts the unary calls of the gRPC server and times them,
// by method, as the original's server reporter does
// (ratelimit_server.<method>.total_requests and .response_time).
type grpcMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	methods  sync.Map // method name -> *methodMetrics
}

// methodMetrics are the metrics of one method.
type methodMetrics struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

// newGRPCMetrics returns the gRPC server's metrics.
func newGRPCMetrics() *grpcMetrics {
	return &grpcMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricRequests,
			Help: "Unary gRPC calls received, by method.",
		}, []string{"grpc_method"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricResponseTime,
			Help:    "Time to answer a unary gRPC call, by method.",
			Buckets: prometheus.DefBuckets,
		}, []string{"grpc_method"}),
	}
}

// unary is a gRPC unary server interceptor that counts and times calls.
// The methods are those the server registers, so the labels are bounded.
func (m *grpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	mm := m.method(info.FullMethod)
	mm.requests.Inc()
	resp, err := handler(ctx, req)
	mm.latency.Observe(time.Since(t0).Seconds())
	return resp, err
}

// method returns the metrics of the method of fullMethod
// ("/package.Service/Method").
func (m *grpcMetrics) method(fullMethod string) *methodMetrics {
	if v, ok := m.methods.Load(fullMethod); ok {
		return v.(*methodMetrics)
	}
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	v, _ := m.methods.LoadOrStore(fullMethod, &methodMetrics{
		requests: m.requests.WithLabelValues(name),
		latency:  m.latency.WithLabelValues(name),
	})
	return v.(*methodMetrics)
}

// newRegistry returns the registry /metrics serves: the Limiter's
// metrics, c, g, and the Go runtime's and the process's.
func newRegistry(lim *hybrid.Limiter, c *collector, g *grpcMetrics) (*prometheus.Registry, error) {
	hc, err := hybridprom.New(lim, hybridprom.Config{})
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	for _, x := range []prometheus.Collector{
		hc, c, g.requests, g.latency,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(x); err != nil {
			return nil, err
		}
	}
	return reg, nil
}
