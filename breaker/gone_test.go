package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

// TestGone: calls under way to a Redis that answers nothing end as soon as
// the network says it is gone (Gone), each counted as a failure, and the
// breaker opens at once, where the same calls, silent, would have been
// pressure until MaxCallTimeout. Until a call succeeds, a call that then
// runs out of time is a failure too; once one succeeds, the silence rule
// holds again.
func TestGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ok := func(context.Context) error { return nil }
		silent := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		if err := b.Do(context.Background(), ok); err != nil {
			t.Fatal(err)
		}

		// Silence alone: three calls run out of time at once, pressure.
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { b.Do(context.Background(), silent) })
		}
		wg.Wait()
		if c := b.Counts(); b.State() != breaker.Closed || c.Pressured != 3 || c.TotalFailures != 0 {
			t.Fatalf("after a stall of one deadline: %v, %d pressured, %d failures; want closed, 3, 0", b.State(), c.Pressured, c.TotalFailures)
		}

		// The network says Redis is gone while three calls wait.
		start := time.Now()
		ended := make(chan time.Duration, 3)
		for range 3 {
			wg.Go(func() {
				b.Do(context.Background(), silent)
				ended <- time.Since(start)
			})
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		b.Gone()
		wg.Wait()
		close(ended)
		for d := range ended {
			if d > time.Millisecond {
				t.Errorf("a call under way ended %v after it began, with Gone at 1ms: want at once", d)
			}
		}
		if c := b.Counts(); b.State() != breaker.Open || c.Pressured != 3 {
			t.Fatalf("after Gone under 3 calls: %v, %d pressured; want open, still 3", b.State(), c.Pressured)
		}

		// Through the open timeout, a probe that times out is a failure:
		// nothing answered since the network's word.
		time.Sleep(breaker.DefaultOpenTimeout + time.Millisecond)
		if err := b.Do(context.Background(), silent); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the probe: %v, want its deadline", err)
		}
		if b.State() != breaker.Open {
			t.Fatalf("after a probe that timed out: %v, want open again", b.State())
		}

		// A call that succeeds ends the network's word: silence is
		// pressure again.
		time.Sleep(breaker.DefaultOpenTimeout + time.Millisecond)
		if err := b.Do(context.Background(), ok); err != nil || b.State() != breaker.Closed {
			t.Fatalf("a probe that succeeded: %v, %v; want closed", err, b.State())
		}
		for range 3 {
			wg.Go(func() { b.Do(context.Background(), silent) })
		}
		wg.Wait()
		if c := b.Counts(); b.State() != breaker.Closed || c.Pressured != 6 {
			t.Fatalf("a stall after a success: %v, %d pressured; want closed, 6", b.State(), c.Pressured)
		}
	})
}
