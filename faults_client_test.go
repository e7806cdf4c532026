package hybrid_test

import (
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestFaultClientKill: CLIENT KILL TYPE normal every 50ms for 1.5s cuts
// every connection of the fleet, over and over. Decisions keep answering
// within their bound; what was admitted is charged to Redis; once the kills
// stop the fleet is normal again within a round (plus the open timeout if a
// breaker opened).
func TestFaultClientKill(t *testing.T) { clientKill(t, newITClient) }

// TestFaultClientKillDefaultClient is TestFaultClientKill on clients with
// go-redis's defaults (three retries, context deadlines not on the socket,
// 3 s read timeout), but for the loopback dialer: what a service passes when
// it hands the limiter the client it has. Its retries re-send settlements
// whose connection was killed: the numbered ones are applied once, so what
// was admitted is still charged once on optimistic keys, and no key is left
// charged less than it admitted.
func TestFaultClientKillDefaultClient(t *testing.T) {
	clientKill(t, func(addr string) *redis.Client {
		return redis.NewClient(&redis.Options{
			Addr:                     addr,
			Dialer:                   redistest.LoopbackDialer(itNetTimeout),
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
	})
}

// clientKill is TestFaultClientKill with clients made by newClient.
func clientKill(t *testing.T, newClient func(addr string) *redis.Client) {
	keys := append(slices.Clone(conserveKeys),
		faultKey{name: "kill-cold", lim: hybrid.Limit{Rate: 1000, Burst: 1000}, every: 10, cold: true})
	srv, admin := faultServer(t)
	ctx := t.Context()
	baseline := runtime.NumGoroutine()
	f := make(itFleet, 2)
	for i := range f {
		f[i] = newITInstanceOn(t, newClient(srv.Addr()), hybrid.Config{}, breaker.Config{}, "kill-"+strconv.Itoa(i))
	}
	load := startFaultLoad(f, 2, keys)

	start := time.Now()
	<-time.After(500 * time.Millisecond)
	marks := f.marks()
	killAt := time.Now()
	kill := time.NewTicker(50 * time.Millisecond)
	var killed int64
	for time.Since(killAt) < 1500*time.Millisecond {
		n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal").Result()
		if err != nil {
			t.Fatalf("CLIENT KILL TYPE normal: %v", err)
		}
		killed += n
		<-kill.C
	}
	kill.Stop()
	stopAt := time.Now()
	took := awaitNormal(t, f, load, marks, stopAt, "after the kills")
	normalAt := stopAt.Add(took)
	<-time.After(500 * time.Millisecond)
	end := time.Now()
	load.end(t)
	opened := false
	for i, in := range f {
		if _, ok := in.states.wait(breaker.Open, marks[i], 0); ok {
			opened = true
		}
	}

	t.Logf("%d connections killed in %v; breakers opened: %v; transitions %v, %v; normal again %v after the last kill",
		killed, stopAt.Sub(killAt).Round(time.Millisecond), opened, f[0].states.since(marks[0]), f[1].states.since(marks[1]), took.Round(time.Millisecond))
	if killed == 0 {
		t.Errorf("CLIENT KILL killed no connection: the test tests nothing")
	}
	load.check(t, span{"before", start, killAt})
	load.check(t, span{"kills", killAt, stopAt})
	after := span{"after recovery", normalAt, end}
	load.check(t, after)
	load.wantNoFallback(t, after)
	load.wantSteady(t, f, after)
	for i, in := range f {
		st := in.lim.Stats()
		t.Logf("instance %d: %d rounds, %d failed; %d key errors; %d fetch errors", i, st.Reconcile.Rounds, st.Reconcile.RoundErrors, st.Reconcile.KeyErrors, st.Reconcile.FetchErrors)
	}
	closeFleet(t, f, baseline)
	checkConserved(t, admin, load, f)
}
