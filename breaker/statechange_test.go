package breaker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

// The state-change callback: order, re-entrance, concurrency and panics.

func TestOnStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			b   *breaker.Breaker
			got []string
		)
		b = mustNew(t, breaker.Config{
			ConsecutiveFailures: 2,
			OnStateChange: func(from, to breaker.State) {
				// Reading the breaker here deadlocks if the callback runs under
				// gobreaker's lock.
				c := b.Counts()
				got = append(got, fmt.Sprintf("%v->%v state=%v trips=%d", from, to, b.State(), c.Trips))
			},
		})
		steps := []struct {
			name string
			run  func()
			want []string // delivered when run returns
		}{
			{"fail", func() { do(b, fail) }, nil},
			{"fail", func() { do(b, fail) }, []string{
				"closed->open state=open trips=1",
			}},
			{"refused", func() { do(b, succeed) }, nil},
			{"sleep OpenTimeout+1", func() { time.Sleep(breaker.DefaultOpenTimeout + 1) }, nil},
			{"State", func() { b.State() }, []string{
				"open->half-open state=half-open trips=1",
			}},
			{"succeed", func() { do(b, succeed) }, []string{
				"half-open->closed state=closed trips=1",
			}},
		}
		var want []string
		for i, s := range steps {
			s.run()
			want = append(want, s.want...)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d (%s): delivered\n%s\nwant\n%s", i, s.name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	})
}

// TestOnStateChangeReentrant causes a transition from inside the callback: it
// is delivered after the callback returns, not nested in it.
func TestOnStateChangeReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			b   *breaker.Breaker
			got []string
		)
		b = mustNew(t, breaker.Config{
			ConsecutiveFailures: 1,
			OnStateChange: func(from, to breaker.State) {
				got = append(got, fmt.Sprintf("enter %v->%v", from, to))
				if to == breaker.Open {
					time.Sleep(breaker.DefaultOpenTimeout + 1)
					got = append(got, fmt.Sprintf("State() = %v", b.State()))
				}
				got = append(got, fmt.Sprintf("exit %v->%v", from, to))
			},
		})
		do(b, fail)
		want := []string{
			"enter closed->open",
			"State() = half-open",
			"exit closed->open",
			"enter open->half-open",
			"exit open->half-open",
		}
		if !slices.Equal(got, want) {
			t.Errorf("delivered\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// TestOnStateChangeConcurrent checks that transitions caused by concurrent
// calls are delivered in order and one at a time: each starts where the
// previous one ended.
func TestOnStateChangeConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			b           *breaker.Breaker
			last        = breaker.Closed
			inCallback  bool
			transitions int
			opened      uint64
		)
		b = mustNew(t, breaker.Config{
			ConsecutiveFailures: 2,
			HalfOpenProbes:      2,
			OpenTimeout:         3 * time.Millisecond,
			CallTimeout:         2 * time.Millisecond,
			OnStateChange: func(from, to breaker.State) {
				if inCallback {
					t.Errorf("OnStateChange(%v, %v) overlaps another call", from, to)
				}
				inCallback = true
				if from != last {
					t.Errorf("OnStateChange(%v, %v) after a transition to %v", from, to, last)
				}
				if to == breaker.Open {
					opened++
				}
				b.State()
				last = to
				transitions++
				inCallback = false
			},
		})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 200 {
					do(b, [...]action{fail, succeed, timeout, cancel, succeed}[(g+i)%5])
					time.Sleep(time.Duration(g%3) * time.Millisecond)
				}
			})
		}
		wg.Wait()
		if got := b.State(); got != last {
			t.Errorf("State() = %v, but the last transition delivered was to %v", got, last)
		}
		if got := b.Counts().Trips; got != opened {
			t.Errorf("Counts().Trips = %d, want %d (transitions to open delivered)", got, opened)
		}
		t.Logf("%d transitions, %d trips", transitions, opened)
		if transitions < 3 {
			t.Errorf("%d transitions, want a few to test anything", transitions)
		}
	})
}

func TestPanicIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, breaker.Config{ConsecutiveFailures: 2})
		for i := range 2 {
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Errorf("call %d: recovered %v, want boom", i, r)
					}
				}()
				b.Do(context.Background(), func(context.Context) error { panic("boom") })
			}()
		}
		if got := b.State(); got != breaker.Open {
			t.Errorf("State() after 2 panics = %v, want open", got)
		}
	})
}

// TestOnStateChangePanic makes the callback panic as a probe lets the breaker
// into half-open: the panic reaches the caller, and the breaker neither waits
// for that probe nor stops delivering transitions.
func TestOnStateChangePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []string
		b := mustNew(t, breaker.Config{
			ConsecutiveFailures: 1,
			OnStateChange: func(from, to breaker.State) {
				got = append(got, fmt.Sprintf("%v->%v", from, to))
				if to == breaker.HalfOpen {
					panic("callback")
				}
			},
		})
		do(b, fail)
		time.Sleep(breaker.DefaultOpenTimeout + 1)
		func() {
			defer func() {
				if r := recover(); r != "callback" {
					t.Errorf("recovered %v, want the callback's panic", r)
				}
			}()
			if called, _ := do(b, succeed); called {
				t.Errorf("the function was called although OnStateChange panicked first")
			}
		}()
		if called, err := do(b, succeed); !called || err != nil {
			t.Fatalf("probe: Do = %v, called %v; want nil, called", err, called)
		}
		if got := b.State(); got != breaker.Closed {
			t.Errorf("State() = %v, want closed", got)
		}
		want := []string{"closed->open", "open->half-open", "half-open->closed"}
		if !slices.Equal(got, want) {
			t.Errorf("delivered %q, want %q", got, want)
		}
	})
}
