package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The outage: the hot descriptor driven for outageBefore, its redis-server
// killed (SIGKILL) for outageFor, then restarted empty (no persistence, as
// the bench's servers run), and driven outageAfter more.
const (
	outageBefore = 3 * time.Second
	outageFor    = 5 * time.Second
	outageAfter  = 4 * time.Second

	// outageDeadline is each call's deadline: generous, so that the
	// original's answers while Redis is down are its own, not the
	// deadline's.
	outageDeadline = time.Second
)

// The phases of an outage run, by when a call was sent.
var outagePhases = []string{"C outage: before", "C outage: Redis down", "C outage: after", "C outage: whole run"}

// TestCompareOutage runs each service on the hot descriptor while its
// Redis is killed for 5 s, and prints, per phase, what the callers got:
// decisions a second, OK, OVER_LIMIT, errors (a gRPC error or an UNKNOWN
// code) and latencies. hybrid-rls must answer every call without error and
// admit at most 2B + R*T over the run: B + R*T, and the burst once more
// because Redis comes back empty (the bucket starts full again, and the
// outage's admissions are charged to it). It skips unless
// HYBRID_RLS_BENCH=1, as TestCompare does:
//
//	HYBRID_RLS_BENCH=1 HYBRID_RLS_ORIGINAL_SRC=/tmp/ratelimit go test -run TestCompareOutage -v -timeout 30m
func TestCompareOutage(t *testing.T) {
	s, bin, env := prepare(t, "to compare hybrid-rls with envoyproxy/ratelimit through a Redis outage")
	var results []Result
	for rep := range s.repeats {
		order := []string{serviceOriginal, serviceHybrid}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			phases := outageCell(t, s, cell{service: name, bin: bin[name], env: env, workload: workloadHot, repeat: rep})
			whole := phases[len(phases)-1]
			t.Logf("%s run %d: %d OK (%.3f of B + R*T), %d OVER_LIMIT, %d errors", name, rep+1, whole.OK, float64(whole.OK)/whole.Bound, whole.OverLimit, whole.Errors)
			if name == serviceHybrid {
				if whole.Errors > 0 {
					t.Errorf("hybrid-rls run %d: %d errors through the outage, want none", rep+1, whole.Errors)
				}
				// Bound is B + R*T; Redis comes back empty, with the
				// bucket full again.
				if most := whole.Bound + hotLimit; float64(whole.OK) > most {
					t.Errorf("hybrid-rls run %d: admitted %d, above 2B + R*T = %.0f", rep+1, whole.OK, most)
				}
			}
			results = append(results, phases...)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers, Redis killed %v in and restarted empty %v later, %v more; GOMAXPROCS of the load %d, %d cores\n\n",
		s.workers, outageBefore, outageFor, outageAfter, runtime.GOMAXPROCS(0), runtime.NumCPU())
	if err := WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// outageCall is one call of an outage run.
type outageCall struct {
	at, lat time.Duration // sent, from the run's start; answered after
	code    rlspb.RateLimitResponse_Code
	err     error
}

// outageCell starts a redis-server of its own and c's service on it,
// drives the hot descriptor while the server is killed and restarted, and
// returns a Result per phase of outagePhases, the whole run last.
func outageCell(t *testing.T, s settings, c cell) []Result {
	t.Helper()
	srv, err := redistest.Start(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c.redis = srv.Addr()
	p := startService(t, c)
	defer p.stop(t)
	conns, closeAll := connect(t, p)
	defer closeAll()

	start := time.Now()
	end := start.Add(outageBefore + outageFor + outageAfter)
	faults := make(chan error, 1)
	go func() {
		// The fault's schedule: a wall-clock script of the run, as an
		// operator's kill would be.
		time.Sleep(time.Until(start.Add(outageBefore)))
		if err := srv.Kill(); err != nil {
			faults <- err
			return
		}
		time.Sleep(time.Until(start.Add(outageBefore + outageFor)))
		faults <- srv.Restart()
	}()
	calls := make([][]outageCall, s.workers)
	var wg sync.WaitGroup
	for w := range s.workers {
		wg.Go(func() {
			client := rlspb.NewRateLimitServiceClient(conns[w%len(conns)])
			req := request("route", "/api")
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), outageDeadline)
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				calls[w] = append(calls[w], outageCall{at: t0.Sub(start), lat: time.Since(t0), code: resp.GetOverallCode(), err: err})
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := <-faults; err != nil {
		t.Fatalf("killing and restarting Redis: %v", err)
	}
	bounds := []time.Duration{0, outageBefore, outageBefore + outageFor, elapsed}
	out := make([]Result, len(outagePhases))
	for i := range out {
		r := &out[i]
		r.Service, r.Workload, r.Repeat = c.service, outagePhases[i], c.repeat
		if i < 3 {
			r.Elapsed = bounds[i+1] - bounds[i]
		} else {
			r.Elapsed = elapsed
			r.Bound = hotLimit + hotLimit*elapsed.Seconds()
		}
	}
	var firstErr error
	for _, wc := range calls {
		for _, call := range wc {
			phase := 2
			for phase > 0 && call.at < bounds[phase] {
				phase--
			}
			for _, r := range []*Result{&out[phase], &out[3]} {
				switch {
				case call.err != nil || call.code != rlspb.RateLimitResponse_OK && call.code != rlspb.RateLimitResponse_OVER_LIMIT:
					r.Errors++
					if firstErr == nil {
						firstErr = call.err
						if firstErr == nil {
							firstErr = fmt.Errorf("code %v", call.code)
						}
					}
					continue
				case call.code == rlspb.RateLimitResponse_OK:
					r.OK++
				default:
					r.OverLimit++
				}
				r.Latencies = append(r.Latencies, call.lat)
			}
		}
	}
	for i := range out {
		slices.Sort(out[i].Latencies)
	}
	if firstErr != nil {
		t.Logf("%s run %d: %d errors, the first: %v", c.service, c.repeat+1, out[3].Errors, firstErr)
	}
	return out
}
