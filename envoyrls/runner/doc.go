// Package runner is the service behind the hybrid-rls command: Envoy's
// rate limit service on a hybrid.Limiter, set up from envoyproxy/ratelimit's
// environment variables, so that a deployment of the original runs with
// this one in its place. The command is flags, wiring and shutdown; the
// service is here, so that it can be tested through its ports:
//
//	cfg, err := runner.FromEnv(os.Environ())   // the original's settings
//	...
//	fs := flag.NewFlagSet("hybrid-rls", flag.ExitOnError)
//	cfg.Flags(fs)                              // -config, -redis, -mode, ...
//	fs.Parse(os.Args[1:])
//	defer runner.StartHeapFloor(cfg.HeapFloor)() // GOGC is the process's: the command's to set
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err = runner.Run(ctx, cfg)                 // Start, serve, Close
//
// A Service serves, as the original does:
//
//   - on its gRPC port (GRPC_HOST:GRPC_PORT, 0.0.0.0:8081, or GRPC_UDS),
//     envoy.service.ratelimit.v3.RateLimitService (package rls), the gRPC
//     health service (the service "ratelimit" and "") and reflection;
//   - on its HTTP port (HOST:PORT, 0.0.0.0:8080), /healthcheck ("OK", or
//     500 while draining and, with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED,
//     while no domain is configured), /json (a RateLimitRequest as JSON,
//     answered as JSON: 200, 429 over the limit, 400 for a request that
//     fails) and /metrics (Prometheus; also at PROMETHEUS_ADDR and
//     PROMETHEUS_PATH with USE_PROMETHEUS);
//   - on its debug port (DEBUG_HOST:DEBUG_PORT, 0.0.0.0:6070), /rlconfig
//     (the configuration in force, a limit a line), /stats (expvar) and
//     /debug/pprof/.
//
// The configuration is the files under
// $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY (package config
// reads them as the original does), checked for changes every
// Config.ReloadInterval; a change is loaded once it has held still for one
// interval, put in force atomically if the files are valid, and otherwise
// logged (the error names the file, the domain and the descriptor path) and
// counted (ratelimit_service_config_load_error) while the configuration in
// force stays.
//
// # Metrics
//
// /metrics has the Limiter's metrics (package hybridprom, hybrid_*), the
// Go runtime's and the process's, and the stats the original keeps per
// descriptor, named as its Prometheus exporter's default mapping names them:
//
//	ratelimit_service_rate_limit_total_hits{domain, key1, key2}
//	ratelimit_service_rate_limit_over_limit{...}      ..._near_limit, ..._within_limit, ..._shadow_mode
//	ratelimit_service_rate_limit_domain_not_found{domain}
//	ratelimit_service_config_load_success, ratelimit_service_config_load_error
//	ratelimit_service_should_rate_limit_error{err_type="service_error"}
//	ratelimit_service_global_shadow_mode
//	ratelimit_service_total_requests{grpc_method}, ratelimit_service_response_time_seconds{grpc_method}
//	hybrid_rls_calls_total{outcome}, hybrid_rls_over_limit_responses_total
//	hybrid_rls_stats_series, hybrid_rls_config_domains
//
// domain, key1 and key2 are the first three dot-separated parts of the
// descriptor's stats key (config.Match.StatsKey), made a stat name as the
// original makes it; a stats key of more levels counts with its first
// three, as the original's mapping has it. Config.MaxSeries bounds the
// label sets (detailed_metric and value_to_metric put request values in
// them): past it, hits count under an empty domain.
//
// # Differences from the original's settings
//
//   - No REDIS_URL (and no -redis) starts an embedded, in-memory Redis,
//     with a warning, where the original dials its default,
//     /var/run/nutcracker/ratelimit.sock. A Redis that does not answer at
//     start is a warning, not a wait: the Limiter's fallback decides until
//     it answers.
//   - LOG_LEVEL defaults to info rather than warn.
//   - The configuration directory is always
//     $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY; the
//     original, with RUNTIME_WATCH_ROOT true, loads nothing at all when
//     RUNTIME_SUBDIRECTORY is unset. RUNTIME_WATCH_ROOT is read but changes
//     nothing: a symlink swap and a change inside the directory both reload.
//   - A directory that does not exist at start is an error.
//   - BACKEND_TYPE other than redis, CONFIG_TYPE other than FILE and
//     GRPC_SERVER_USE_TLS are errors; the other settings of the original
//     that do not apply (statsd, the per-second Redis, the local cache,
//     tracing, xDS, memcache, Redis pipelining and timeouts) are logged as
//     not applied (Config.Ignored).
package runner
