package breaker_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

// stalled is a Redis that answers a call at once, except between from and
// until, when it answers nothing: a call made then waits for until or for
// its deadline.
type stalled struct{ from, until time.Time }

// call makes one call of size 1 through b to r and returns its error.
func (r stalled) call(b *breaker.Breaker) error {
	return b.Do(context.Background(), func(ctx context.Context) error {
		now := time.Now()
		if now.Before(r.from) || !now.Before(r.until) {
			return nil
		}
		select {
		case <-time.After(r.until.Sub(now)):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// load makes workers goroutines call r through b one call after another,
// each pausing gap (at least 1ms) between two calls, until stop, and
// returns when they are done.
func load(b *breaker.Breaker, r stalled, workers int, gap time.Duration, stop time.Time) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r.call(b)
				time.Sleep(max(gap, time.Millisecond))
			}
		})
	}
	wg.Wait()
}

// TestSilence: with deadlines that adapt (CallTimeout 50ms, MaxCallTimeout
// 500ms), the calls that run out of time in a stall shorter than
// MaxCallTimeout are load, however many run into it at once and one after
// another: pressure, not failures, and the breaker stays closed. A Redis
// that answers nothing for longer opens it, under heavy and light load
// alike: its silence runs from the first call made since it last answered,
// across the gaps between calls, so that it is not taken for a new one at
// every call. A stall after a long idle time is counted from the first call
// that ran into it, not from the last answer before the idle time.
func TestSilence(t *testing.T) {
	const (
		callTimeout = 50 * time.Millisecond
		maxTimeout  = 500 * time.Millisecond
	)
	tests := []struct {
		name     string
		idle     time.Duration // after a first call that succeeds
		stall    time.Duration // then; 0: forever
		workers  int
		gap      time.Duration // between two calls of a worker, at least 1ms
		run      time.Duration // the load's length, from the stall's start
		opensBy  time.Duration // after the stall's start; 0: stays closed
		pressure bool          // some calls counted as pressure
	}{
		{"a stall of 450ms under 16 callers", 0, 450 * time.Millisecond, 16, 0, time.Second, 0, true},
		{"a stall of 450ms under 1 caller", 0, 450 * time.Millisecond, 1, 0, time.Second, 0, true},
		{"a stall of 450ms after 10s idle", 10 * time.Second, 450 * time.Millisecond, 16, time.Millisecond, time.Second, 0, true},
		// Three calls in a row run out of time once the silence passed
		// 500ms: the last ends by 500ms plus two deadlines.
		{"silent under 16 callers", 0, 0, 16, 0, time.Second, maxTimeout + 2*callTimeout, true},
		{"silent after 10s idle", 10 * time.Second, 0, 16, 0, time.Second, maxTimeout + 2*callTimeout, true},
		// A call every 100ms: the silence spans the gaps between them.
		{"silent under a call every 100ms", 0, 0, 1, 100 * time.Millisecond, 2 * time.Second, maxTimeout + 3*(callTimeout+100*time.Millisecond), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var opened time.Time
				b := mustNew(t, breaker.Config{CallTimeout: callTimeout, MaxCallTimeout: maxTimeout, OnStateChange: func(_, to breaker.State) {
					if to == breaker.Open && opened.IsZero() {
						opened = time.Now()
					}
				}})
				if err := (stalled{}).call(b); err != nil {
					t.Fatalf("first call: %v", err)
				}
				time.Sleep(tt.idle)
				start := time.Now()
				r := stalled{from: start, until: start.Add(tt.stall)}
				if tt.stall == 0 {
					r.until = start.Add(time.Hour)
				}
				load(b, r, tt.workers, tt.gap, start.Add(tt.run))
				c := b.Counts()
				if got := c.Pressured > 0; got != tt.pressure {
					t.Errorf("Counts().Pressured = %d, want some: %v", c.Pressured, tt.pressure)
				}
				if tt.opensBy == 0 {
					if !opened.IsZero() || c.TotalFailures != 0 || b.State() != breaker.Closed {
						t.Errorf("after the stall: state %v, Counts %+v, opened %v after its start; want closed, no failure", b.State(), c, opened.Sub(start))
					}
					return
				}
				if opened.IsZero() {
					t.Fatalf("breaker not open %v into the silence: Counts %+v", tt.run, c)
				}
				if at := opened.Sub(start); at < maxTimeout || at > tt.opensBy {
					t.Errorf("breaker opened %v into the silence, want in [%v, %v]", at, maxTimeout, tt.opensBy)
				}
			})
		})
	}
}
