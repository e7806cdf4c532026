package reconcile_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/reconcile"
)

// TestBatchWindow: the batches that may be on their way to a node follow
// what their round trips measure. Across a network (a round trip of 5ms of
// which Redis's work is a few µs) the window opens, and a request that
// comes while batches are on their way leaves within a fraction of a round
// trip: its decision takes little more than one round trip, where with one
// batch at a time it took about one and a half. On a busy Redis (its work
// most of the round trip) the window stays at its floor, one batch in a
// fleet, and the batches stay as large as the load makes them. A fleet of
// two instances in both; requests come at a steady pace, each from a
// goroutine of its own, as an open loop of users' requests.
func TestBatchWindow(t *testing.T) {
	for _, c := range []struct {
		name        string
		delay, work time.Duration // the round trip's path; Redis's work per settlement
		gap         time.Duration // between two requests
		minWin      int           // the window at the end, at least
		maxWin      int           // and at most
		maxLatency  float64       // the mean decision, in round trips at least, at most
		minPerBatch float64       // settlements a batch, on average, at least
	}{
		{"network", 5 * time.Millisecond, 2 * time.Microsecond, 5 * time.Millisecond / 16, 4, 8, 1.25, 2},
		{"busy", 20 * time.Microsecond, 40 * time.Microsecond, 10 * time.Microsecond, 1, 1, 0, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				testBatchWindow(t, c.delay, c.work, c.gap, c.minWin, c.maxWin, c.maxLatency, c.minPerBatch)
			})
		})
	}
}

func testBatchWindow(t *testing.T, delay, work, gap time.Duration, minWin, maxWin int, maxLatency, minPerBatch float64) {
	st := newStore()
	st.live = 2
	st.delay, st.work = delay, work
	r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 2})
	defer r.Close(context.Background())
	m, _ := global.Limit{Rate: 1e6, Burst: 1e6}.Micro()
	const asks = 400
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		took  time.Duration // the second half's decisions, summed
		timed int
	)
	for i := range asks {
		wg.Go(func() {
			s := global.Settlement{Key: fmt.Sprint("k", i), Limit: m, Want: M, MinGrant: M, Quantum: M}
			start := time.Now()
			if rep, err := r.SettleNow(context.Background(), s); err != nil || rep.Granted != M {
				t.Errorf("ask %d: %+v, %v", i, rep, err)
			}
			if i >= asks/2 { // the window has had time to settle
				mu.Lock()
				took += time.Since(start)
				timed++
				mu.Unlock()
			}
		})
		time.Sleep(gap)
	}
	wg.Wait()
	rtt := delay + work
	mean := took / time.Duration(timed)
	if maxLatency > 0 && float64(mean) > maxLatency*float64(rtt) {
		t.Errorf("a decision took %v on average, more than %.2f round trips of %v", mean, maxLatency, rtt)
	}
	s := r.Stats()
	win := s.Nodes[0].Window
	if win < minWin || win > maxWin {
		t.Errorf("window %d (path %v, batches %v), want %d to %d", win, s.Nodes[0].PathRTT, s.Nodes[0].BatchRTT, minWin, maxWin)
	}
	if per := float64(s.Batched) / float64(s.Batches); per < minPerBatch {
		t.Errorf("%d batches of %d settlements: %.2f a batch, want at least %.0f", s.Batches, s.Batched, per, minPerBatch)
	}
	if s.Nodes[0].PathRTT < delay {
		t.Errorf("path %v, shorter than the round trip's %v", s.Nodes[0].PathRTT, delay)
	}
}

// TestBatchWindowTwo: two requests of one instance in a fleet, each asked
// again soon after it is answered (a handler's work between them), across
// a network. Both are on their way at once: with one batch at a time they
// take turns, each waiting for the other's round trip, and a decision
// takes about two. The requests outstanding when a batch is back are two
// on most batches and one on the few that come while the other request is
// between asks; their average, about 1.9, is two that take turns.
func TestBatchWindowTwo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			delay = 5 * time.Millisecond
			think = 500 * time.Microsecond // between an answer and the next ask
			asks  = 200                    // each
		)
		st := newStore()
		st.live = 4
		st.delay = delay
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
		defer r.Close(context.Background())
		m, _ := global.Limit{Rate: 1e6, Burst: 1e6}.Micro()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			took time.Duration // the second half's decisions, summed
		)
		for g := range 2 {
			wg.Go(func() {
				time.Sleep(time.Duration(g) * delay / 3) // not in step
				for i := range asks {
					s := global.Settlement{Key: fmt.Sprint("k", g, "-", i), Limit: m, Want: M, MinGrant: M, Quantum: M}
					start := time.Now()
					if rep, err := r.SettleNow(context.Background(), s); err != nil || rep.Granted != M {
						t.Errorf("ask %d: %+v, %v", i, rep, err)
					}
					if i >= asks/2 {
						mu.Lock()
						took += time.Since(start)
						mu.Unlock()
					}
					time.Sleep(think)
				}
			})
		}
		wg.Wait()
		mean := took / asks // two halves of asks
		if mean > delay*5/4 {
			s := r.Stats()
			t.Errorf("a decision took %v on average, more than 1.25 round trips of %v (window %d)", mean, delay, s.Nodes[0].Window)
		}
	})
}
