package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/reconcile"
)

// TestBatch: settlements that requests need at once go together. With the
// first two on their way (held at the store's gate; the first one alone in
// a fleet), the other requests for other keys wait and go in one Settle
// call, sent as soon as the first is back; each gets its own reply. One
// caller that gives up gets its context's error and leaves the others'
// decisions alone. Those that waited are counted, with how long (Queued,
// QueueWait). An idle Reconciler sends a request's settlement at once,
// alone.
func TestBatch(t *testing.T) {
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprint("instances=", instances), func(t *testing.T) { testBatch(t, instances) })
	}
}

func testBatch(t *testing.T, instances int) {
	flights := 2 // batches on their way at once: two for an instance alone
	if instances > 1 {
		flights = 1 // one in a fleet
	}
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		gate := make(chan struct{})
		st.gate = gate
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: instances})
		defer r.Close(context.Background())
		m, _ := global.Limit{Rate: 1, Burst: 10}.Micro()
		settlement := func(i int) global.Settlement {
			return global.Settlement{Key: fmt.Sprint("k", i), Limit: m, Want: int64(i%10+1) * M, MinGrant: M, Quantum: M}
		}
		const n = 50
		replies := make([]global.Reply, n)
		errs := make([]error, n)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				c := context.Background()
				if i == 7 {
					c = ctx // the one that gives up
				}
				replies[i], errs[i] = r.SettleNow(c, settlement(i))
			})
			synctest.Wait() // in order: the first ones go at once, the rest wait
		}
		st.mu.Lock()
		entered := st.entered
		st.mu.Unlock()
		if entered != flights {
			t.Fatalf("%d Settle calls on their way with %d requests waiting, want %d", entered, n, flights)
		}
		cancel()
		synctest.Wait()
		const hold = 2 * time.Millisecond // the first batches on their way
		time.Sleep(hold)
		st.mu.Lock()
		st.gate = nil
		st.mu.Unlock()
		close(gate)
		wg.Wait()
		synctest.Wait()
		st.mu.Lock()
		sizes := slices.Clone(st.sizes)
		st.mu.Unlock()
		want := append(slices.Repeat([]int{1}, flights), n-flights)
		if slices.Sort(sizes); !slices.Equal(sizes, want) {
			t.Errorf("Settle calls of %v settlements, want %v", sizes, want)
		}
		for i := range n {
			if i == 7 {
				if errs[i] != context.Canceled {
					t.Errorf("request %d, given up: %v, want %v", i, errs[i], context.Canceled)
				}
				continue
			}
			if want := int64(i%10+1) * M; errs[i] != nil || replies[i].Granted != want || replies[i].Tokens != 10*M-want {
				t.Errorf("request %d: %+v, %v; want granted %d", i, replies[i], errs[i], want)
			}
		}
		// The one that gave up was settled all the same: in its batch.
		if got, _ := st.get("k7"); got != 2*M {
			t.Errorf("k7 holds %d, want %d: applied in its batch", got, 2*M)
		}
		s := r.Stats()
		if s.Batches != uint64(flights+1) || s.Batched != n {
			t.Errorf("Stats: %d batches of %d settlements, want %d of %d", s.Batches, s.Batched, flights+1, n)
		}
		// The waiting ones (the one that gave up too: it went in its
		// batch) waited for the first batches, the hold and more.
		if queued := uint64(n - flights); s.Queued != queued || s.QueueWait.Count != queued ||
			s.QueueWait.Sum < time.Duration(queued)*hold || s.QueueWait.Max < hold {
			t.Errorf("Stats: %d queued, waits %+v; want %d, each %v at least", s.Queued, s.QueueWait, queued, hold)
		}
		// Every batch was answered; the first ones were held on their way.
		if bt := s.BatchTrip; bt.Count != s.Batches || bt.Sum < time.Duration(flights)*hold || bt.Max < hold {
			t.Errorf("Stats: batch round trips %+v; want %d, %d of them %v at least", bt, s.Batches, flights, hold)
		}

		// Idle: a request goes at once, alone.
		if rep, err := r.SettleNow(context.Background(), settlement(100)); err != nil || rep.Granted != M {
			t.Fatalf("an idle request: %+v, %v", rep, err)
		}
		st.mu.Lock()
		last := st.sizes[len(st.sizes)-1]
		st.mu.Unlock()
		if last != 1 {
			t.Errorf("an idle request went in a Settle of %d", last)
		}
		if q := r.Stats().Queued; q != s.Queued {
			t.Errorf("an idle request counted as queued: %d, was %d", q, s.Queued)
		}
	})
}

// TestBatchWave: callers that ask again as soon as they are answered (a
// closed loop of 8) go together in one batch a round trip, not in two
// halves that take turns: a batch back lets the callers it answered ask
// again before the next is sent. Without that the batches read 1, 7, 1,
// 7...
func TestBatchWave(t *testing.T) {
	// On one processor a yield runs every goroutine it made ready before
	// the one that yielded; on more, an idle one takes the yielder back at
	// once, and how many callers ask again meanwhile depends on their
	// speed (under the race detector, half of them).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		st.live = 2 // a fleet: one batch on its way at a time
		// A busy Redis (its work most of a round trip): the window stays
		// at one batch (see TestBatchWindow).
		st.delay, st.work = 20*time.Microsecond, 100*time.Microsecond
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 2})
		defer r.Close(context.Background())
		m, _ := global.Limit{Rate: 1e6, Burst: 1e6}.Micro()
		const callers, asks = 8, 40
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range asks {
					s := global.Settlement{Key: fmt.Sprint("k", c, "-", i), Limit: m, Want: M, MinGrant: M, Quantum: M}
					if rep, err := r.SettleNow(context.Background(), s); err != nil || rep.Granted != M {
						t.Errorf("caller %d, ask %d: %+v, %v", c, i, rep, err)
						return
					}
				}
			})
		}
		wg.Wait()
		st.mu.Lock()
		sizes := slices.Clone(st.sizes)
		st.mu.Unlock()
		// Past the first few batches, which the callers' start staggers.
		tail := sizes[len(sizes)/2:]
		sum := 0
		for _, n := range tail {
			sum += n
		}
		if mean := float64(sum) / float64(len(tail)); mean < 6 {
			t.Errorf("Settle calls of %v settlements (the last %d: %.1f a call), want about %d a call", sizes, len(tail), mean, callers)
		}
	})
}

// TestSettleNowBroken: a call whose connection broke under it (EOF) is sent
// again once, and the second call's reply is the answer. If the second fails
// too, its error is returned, unless it says the call surely was not applied
// (a refused connection) while the first may have been: then the first's
// stands, so that a numbered settlement stays in doubt.
func TestSettleNowBroken(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		name   string
		errs   []error // what the store's calls fail with, in turn (nil: answered)
		want   error   // what SettleNow returns
		calls  int
		resent uint64
	}{
		{"answered", []error{nil}, nil, 1, 0},
		{"EOF, then answered", []error{io.EOF, nil}, nil, 2, 1},
		{"reset, then answered", []error{syscall.ECONNRESET, nil}, nil, 2, 1},
		{"EOF twice", []error{io.EOF, io.ErrUnexpectedEOF}, io.ErrUnexpectedEOF, 2, 1},
		{"EOF, then refused", []error{io.EOF, refused}, io.EOF, 2, 1},
		{"refused", []error{refused}, refused, 1, 0},
		{"a timeout", []error{context.DeadlineExceeded}, context.DeadlineExceeded, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &failing{store: newStore(), errs: c.errs}
				r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 1})
				defer r.Close(context.Background())
				s := global.Settlement{Key: "k", Limit: spec(t, 10, 10, reconcile.Exact).Limit, Want: M, MinGrant: M, Quantum: M}
				rep, err := r.SettleNow(context.Background(), s)
				if err == nil {
					err = rep.Err
				}
				if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
					t.Errorf("SettleNow: %v, want %v", err, c.want)
				}
				if c.want == nil && rep.Granted != M {
					t.Errorf("granted %d, want %d", rep.Granted, M)
				}
				if got := st.calls(); got != c.calls {
					t.Errorf("%d calls, want %d", got, c.calls)
				}
				if got := r.Stats().Resent; got != c.resent {
					t.Errorf("Resent = %d, want %d", got, c.resent)
				}
			})
		})
	}
}

// failing is a store whose Settle calls fail with errs in turn (a nil
// answers), then answer.
type failing struct {
	*store
	mu   sync.Mutex
	errs []error
	n    int
}

func (f *failing) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	f.mu.Lock()
	f.n++
	var err error
	if len(f.errs) > 0 {
		err, f.errs = f.errs[0], f.errs[1:]
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.store.Settle(ctx, batch, replies)
}

func (f *failing) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}
