package breaker_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

// call makes one call of size n through b that takes d (or until its
// deadline), and returns its error.
func call(b *breaker.Breaker, n int, d time.Duration) error {
	return b.DoN(context.Background(), n, func(ctx context.Context) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// TestAdaptiveTimeout: a call's deadline follows the latency of the calls
// that succeeded, as their mean plus four deviations, at least CallTimeout
// and at most MaxCallTimeout, and a larger call gets its work on top: a
// Redis whose latency varies between 2 and 9 ms gets deadlines that let a
// call of 15 ms through, where a fixed 10 ms would have failed it.
func TestAdaptiveTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{CallTimeout: 10 * time.Millisecond, MaxCallTimeout: 40 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Timeout(1); got != 10*time.Millisecond {
			t.Fatalf("Timeout(1) = %v before any call, want CallTimeout 10ms", got)
		}
		// Before a large call succeeded, a key's work is taken for 25µs.
		if got, want := b.Timeout(101), 10*time.Millisecond+2*100*25*time.Microsecond; got != want {
			t.Fatalf("Timeout(101) = %v before any call, want %v", got, want)
		}
		for i := range 20 {
			d := 2 * time.Millisecond
			if i%2 == 1 {
				d = 9 * time.Millisecond
			}
			if err := call(b, 1, d); err != nil {
				t.Fatalf("call %d of %v: %v", i, d, err)
			}
		}
		if got := b.Timeout(1); got <= 15*time.Millisecond || got > 40*time.Millisecond {
			t.Fatalf("Timeout(1) = %v after calls of 2 and 9 ms, want above 15ms and at most 40ms", got)
		}
		if err := call(b, 1, 15*time.Millisecond); err != nil {
			t.Fatalf("a call of 15ms after calls of 2 and 9 ms: %v", err)
		}
		// Calls of 100 keys that take 30 ms teach 0.3 ms a key (at most):
		// a call of 100 keys then gets about 60 ms on top, capped at 40.
		for range 10 {
			if err := call(b, 100, 30*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if got := b.Timeout(100); got != 40*time.Millisecond {
			t.Fatalf("Timeout(100) = %v after calls of 100 keys in 30ms, want MaxCallTimeout 40ms", got)
		}
		// A Redis slower than the ceiling fails, once it has answered
		// nothing for the ceiling: the calls that run out of time before
		// are pressure.
		start := time.Now()
		calls := 0
		for b.Counts().TotalFailures == 0 {
			if calls++; calls > 10 {
				t.Fatalf("%d calls of 1s, none a failure: Counts %+v", calls-1, b.Counts())
			}
			if err := call(b, 1, time.Second); err == nil {
				t.Fatal("a call of 1s succeeded with MaxCallTimeout 40ms")
			}
		}
		silent := time.Since(start)
		if silent < 40*time.Millisecond || silent-b.Timeout(1) >= 40*time.Millisecond {
			t.Errorf("the first failure ended %v of silence, want the first call to end past MaxCallTimeout 40ms (deadline %v)", silent, b.Timeout(1))
		}
		if c := b.Counts(); c.TotalFailures != 1 || c.Pressured != uint64(calls-1) {
			t.Fatalf("Counts = %+v, want 1 failure, %d pressured", c, calls-1)
		}
	})
}

// TestFixedTimeout: MaxCallTimeout at CallTimeout fixes the deadline,
// whatever the calls' latency and size.
func TestFixedTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{CallTimeout: 10 * time.Millisecond, MaxCallTimeout: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if err := call(b, 500, 9*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []int{1, 500} {
			if got := b.Timeout(n); got != 10*time.Millisecond {
				t.Errorf("Timeout(%d) = %v, want 10ms", n, got)
			}
		}
	})
}

// TestPressure: a call that runs out of time while another call of the
// breaker succeeds counts neither way (a busy Redis is not a failed one);
// one that runs out of time while none does is a failure, and three in a
// row trip the breaker as before.
func TestPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{CallTimeout: 50 * time.Millisecond, MaxCallTimeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			var wg sync.WaitGroup
			var slow error
			wg.Go(func() { slow = call(b, 1, time.Second) })
			wg.Go(func() {
				time.Sleep(10 * time.Millisecond)
				if err := call(b, 1, 5*time.Millisecond); err != nil {
					t.Error(err)
				}
			})
			wg.Wait()
			if slow == nil {
				t.Fatal("a call of 1s succeeded with a deadline of 50ms")
			}
		}
		c := b.Counts()
		if c.Pressured != 5 || c.TotalFailures != 0 || c.TotalSuccesses != 5 || b.State() != breaker.Closed {
			t.Fatalf("after 5 slow calls while fast ones succeeded: Counts %+v, state %v; want 5 pressured, no failure, closed", c, b.State())
		}
		for range 3 {
			if err := call(b, 1, time.Second); err == nil {
				t.Fatal("a call of 1s succeeded")
			}
		}
		if c := b.Counts(); b.State() != breaker.Open || c.Trips != 1 {
			t.Fatalf("after 3 slow calls and nothing else: state %v, Counts %+v; want open", b.State(), c)
		}
	})
}
