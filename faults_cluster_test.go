package hybrid_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/local"
)

// TestFaultClusterMaster: one master of a 3-master Redis Cluster is killed
// (-9) with the load running, then restarted empty. The cluster runs with
// cluster-require-full-coverage no, so that the other masters keep serving
// their slots while one is down (docs/failure.md). While it is down:
//
//   - the keys of the dead master are decided by the fallback, within the
//     usual bound, once its breaker opened;
//   - the keys of the other masters never go to the fallback, their
//     breakers stay closed, and their rounds keep charging Redis;
//
// and when it is back every breaker closes, and after Close every bucket
// holds what was admitted: on the live masters all of it, on the restarted
// one all that was admitted since the kill (what it held before died with
// it).
func TestFaultClusterMaster(t *testing.T) {
	c := redistest.ClusterWith(t, redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	if !c.Owned() {
		t.Skip("REDIS_CLUSTER_ADDRS names a shared cluster this test would disturb")
	}
	admin := redistest.ClusterClient(t, c)
	ctx := t.Context()
	nodes := c.Nodes()
	victim := nodes[1]

	// Two conserve keys (every request admitted, see conserveKeys) and cold
	// keys (a new one each time, all in one slot) per master.
	var keys []faultKey
	onVictim := map[int]bool{}
	for m, p := range nodes {
		for _, fk := range conserveKeys {
			fk.name = keyOn(t, admin, p.Addr(), fk.name+"-"+strconv.Itoa(m))
			if p == victim {
				onVictim[len(keys)] = true
			}
			keys = append(keys, fk)
		}
	}
	for m, p := range nodes {
		name := keyOn(t, admin, p.Addr(), "cluster-cold-"+strconv.Itoa(m))
		if p == victim {
			onVictim[len(keys)] = true
		}
		keys = append(keys, faultKey{name: name, lim: hybrid.Limit{Rate: 1000, Burst: 1000}, every: 10, cold: true, slot: true})
	}

	baseline := runtime.NumGoroutine()
	f := make(itFleet, 2)
	for i := range f {
		f[i] = newITClusterInstance(t, c, "cluster-fault-"+strconv.Itoa(i))
	}
	load := startFaultLoad(f, 2, keys)

	start := time.Now()
	<-time.After(700 * time.Millisecond)
	before := tokensOnNodes(t, admin, keys, onVictim)
	marks := f.marks()
	killAt := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	opened := awaitOpen(t, f, marks, killAt, "master killed")
	openAt := killAt.Add(opened)
	<-time.After(1500 * time.Millisecond)
	during := tokensOnNodes(t, admin, keys, onVictim)
	for i, in := range f {
		st := in.lim.Stats()
		down := 0
		for _, n := range st.Reconcile.Nodes {
			switch {
			case n.Addr == victim.Addr():
				if n.Breaker == breaker.Closed {
					t.Errorf("instance %d: breaker of the dead master %s closed", i, n.Addr)
				}
				down++
			case n.Breaker != breaker.Closed:
				t.Errorf("instance %d: breaker of %q is %v with its master up", i, n.Addr, n.Breaker)
			}
		}
		if down != 1 || len(st.Reconcile.Nodes) != len(nodes)+1 {
			t.Errorf("instance %d: node breakers %+v, want the default and one per master, the dead one not closed", i, st.Reconcile.Nodes)
		}
		if !st.Degraded {
			t.Errorf("instance %d: Stats.Degraded false with a master down", i)
		}
	}
	restartAt := time.Now()
	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	// The restarted node answers CLUSTERDOWN until it has rejoined: an
	// error reply for its keys, which the fallback decides meanwhile.
	if err := c.WaitOK(); err != nil {
		t.Fatal(err)
	}
	okAt := time.Now()
	// A restarted cluster node takes a moment to serve its slots again,
	// so the bound is generous: faultStateWait.
	took, ok := untilNormal(t, f, f.marks(), restartAt, "master restarted")
	if !ok {
		t.FailNow()
	}
	normalAt := restartAt.Add(took)
	<-time.After(700 * time.Millisecond)
	end := time.Now()
	load.end(t)

	t.Logf("the breakers of the dead master opened %v after the kill; after the restart every breaker closed and a round succeeded within %v (the cluster was ok again %v after the restart)",
		opened.Round(time.Millisecond), took.Round(time.Millisecond), okAt.Sub(restartAt).Round(time.Millisecond))
	load.check(t, span{"before", start, killAt})
	load.check(t, span{"master down", killAt, restartAt})
	load.check(t, span{"after", normalAt, end})
	// A decision begun within ColdWait of the kill may still wait for
	// Redis when the master dies, and the refused dials send it to the
	// fallback at once: the stretch with Redis up ends ColdWait before.
	load.wantNoFallback(t, span{"before", start, killAt.Add(-faultColdWait)})

	// The other masters' keys: never the fallback, and charged meanwhile.
	for k, fk := range keys {
		fallback, total := 0, 0
		for _, d := range load.all {
			if d.key != k || d.start.Before(killAt) || !d.start.Before(restartAt) {
				continue
			}
			total++
			if d.src == hybrid.SourceFallback {
				fallback++
			}
		}
		switch {
		case onVictim[k] && fk.lim.Mode == hybrid.Lease:
			// (An optimistic key spends its budget meanwhile: no fallback
			// until that runs out.)
			if after := fallbackAfter(load, k, openAt.Add(faultColdWait+faultMargin), restartAt); after == 0 {
				t.Errorf("%s, on the dead master: no decision by the fallback while it was down", fk.name)
			}
		case !onVictim[k] && fallback > 0:
			if stall, ok := load.stalled(span{"master down", killAt, restartAt}); ok {
				t.Logf("%s, on a live master: %d of %d decisions by the fallback; not checked: the process stalled for %v", fk.name, fallback, total, stall)
			} else {
				t.Errorf("%s, on a live master: %d of %d decisions by the fallback while another master was down, want none", fk.name, fallback, total)
			}
		}
		if !onVictim[k] && !fk.cold && during[k] >= before[k] {
			t.Errorf("%s, on a live master: bucket %d micro-tokens before the kill and %d with the master down: not charged meanwhile", fk.name, before[k], during[k])
		}
	}

	closeFleet(t, f, baseline)

	// Conservation: the live masters hold what was admitted. The restarted
	// one lost what it held, leases included, so it must hold what was
	// admitted since the kill without a lease: by the fallback in lease
	// mode, every decision in optimistic mode (whose consumption is charged
	// after it is admitted).
	for k, fk := range keys {
		if fk.cold {
			continue
		}
		var admitted, since int64
		for _, d := range load.all {
			if d.key != k || !d.allowed {
				continue
			}
			admitted++
			if !d.start.Before(killAt) && (fk.lim.Mode != hybrid.Lease || d.src == hybrid.SourceFallback) {
				since++
			}
		}
		want := admitted
		if onVictim[k] {
			want = since
		}
		got, err := redistest.BucketTokens(ctx, admin, "hybrid:{"+fk.name+"}")
		if err != nil {
			t.Errorf("%s: bucket: %v", fk.name, err)
			continue
		}
		slack := int64(fk.lim.Rate * local.Micro * 60)
		t.Logf("%s (dead master: %v): admitted %d, %d to charge to it; bucket %.3f tokens: %.3f charged beyond that",
			fk.name, onVictim[k], admitted, want, float64(got)/local.Micro, float64((fk.lim.Burst-want)*local.Micro-got)/local.Micro)
		if limit := (fk.lim.Burst - want) * local.Micro; got > limit+slack {
			t.Errorf("%s: bucket holds %d micro-tokens, more than B - %d = %d: %.3f admitted tokens were never charged",
				fk.name, got, want, limit, float64(got-limit-slack)/local.Micro)
		}
	}
}

// newITClusterInstance returns an instance on cluster c, with a cluster
// client of its own configured as newITClient configures a client.
func newITClusterInstance(t *testing.T, c *redistest.ClusterProc, id string) *itInstance {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    c.Addrs(),
		Dialer:                   redistest.LoopbackDialer(itNetTimeout),
		MaxRetries:               -1,
		DialTimeout:              itNetTimeout,
		ReadTimeout:              itNetTimeout,
		WriteTimeout:             itNetTimeout,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	in := &itInstance{rdb: rdb, states: newTransitions()}
	l, err := hybrid.New(rdb, hybrid.Config{InstanceID: id, Breaker: breaker.Config{OnStateChange: in.states.record}})
	if err != nil {
		rdb.Close()
		t.Fatal(err)
	}
	in.lim = l
	t.Cleanup(func() {
		l.Close(context.Background())
		rdb.Close()
	})
	return in
}

// keyOn returns the first of prefix, prefix-1, prefix-2... whose bucket is
// on the master at addr.
func keyOn(t *testing.T, admin *redis.ClusterClient, addr, prefix string) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		k := prefix
		if i > 0 {
			k += "-" + strconv.Itoa(i)
		}
		m, err := admin.MasterForKey(t.Context(), "hybrid:{"+k+"}")
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		if m.Options().Addr == addr {
			return k
		}
	}
	t.Fatalf("no key %s-N on %s", prefix, addr)
	return ""
}

// tokensOnNodes reads the tokens of the buckets of the conserve keys that
// are not on the dead master.
func tokensOnNodes(t *testing.T, admin *redis.ClusterClient, keys []faultKey, onVictim map[int]bool) map[int]int64 {
	t.Helper()
	m := map[int]int64{}
	for k, fk := range keys {
		if fk.cold || onVictim[k] {
			continue
		}
		v, err := redistest.BucketTokens(t.Context(), admin, "hybrid:{"+fk.name+"}")
		if err != nil {
			t.Fatalf("%s: bucket: %v", fk.name, err)
		}
		m[k] = v
	}
	return m
}

// fallbackAfter counts the decisions for key k made by the fallback in
// [from, to).
func fallbackAfter(l *faultLoad, k int, from, to time.Time) int {
	n := 0
	for _, d := range l.all {
		if d.key == k && d.src == hybrid.SourceFallback && !d.start.Before(from) && d.start.Before(to) {
			n++
		}
	}
	return n
}
