// Package bench compares hybrid-rls with envoyproxy/ratelimit (the
// original) on the same machine, the same redis-server and the same load.
//
// It is a module of its own so that neither the limiter's module nor
// envoyrls depends on it. It does not import the original's packages: the
// original runs as a process of its own, built from its source at
// benchmark time, and hybrid-rls runs as a process too, built from
// envoyrls/cmd/hybrid-rls. Both get the same YAML configuration and the
// same environment, and are driven over gRPC by the same closed-loop load
// generator, one service at a time.
//
// The comparison is TestCompare, which runs only when asked:
//
//	git clone https://github.com/envoyproxy/ratelimit /tmp/ratelimit
//	cd envoyrls/bench
//	HYBRID_RLS_BENCH=1 HYBRID_RLS_ORIGINAL_SRC=/tmp/ratelimit go test -run TestCompare -v -timeout 30m
//
// TestCompareOutage, behind the same flag, drives the hot descriptor on
// each service while its redis-server is killed for 5 s and restarted
// empty, and prints what the callers got in each phase:
//
//	HYBRID_RLS_BENCH=1 HYBRID_RLS_ORIGINAL_SRC=/tmp/ratelimit go test -run TestCompareOutage -v -timeout 30m
//
// Its settings are environment variables, read by settingsFromEnv:
//
//	HYBRID_RLS_BENCH=1            run the comparison (it skips otherwise)
//	HYBRID_RLS_ORIGINAL_SRC=DIR   the original's source, built into a temporary directory
//	HYBRID_RLS_ORIGINAL_BIN=FILE  or a binary of it built already (go build ./src/service_cmd)
//	HYBRID_RLS_BENCH_DURATION=5s  the load's length in each cell
//	HYBRID_RLS_BENCH_REPEATS=2    runs of each cell, alternating which service goes first
//	HYBRID_RLS_BENCH_WORKERS=32   concurrent callers, each waiting for its answer
//	HYBRID_RLS_BENCH_RTT=0,1ms    round trips added between the services and Redis
//	HYBRID_RLS_BENCH_USERS=100000 the per-user workload's ids
//	HYBRID_RLS_BENCH_CPUS=shared  shared: the load, the services and Redis share the
//	                              processors; split: the load (and the latency proxy)
//	                              on the first half, the services and Redis on the rest,
//	                              as where Envoy runs on other hosts (Linux; TestCompare)
//	HYBRID_RLS_BENCH_FLOOR=0      1: TestCompare runs the gRPC floor beside the services, a
//	                              RateLimitService that answers OK without deciding (floor_test.go):
//	                              the most decisions a second a Go service could make here
//
// Only loopback addresses are used.
package bench
