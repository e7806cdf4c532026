package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

var errRedis = errors.New("dial tcp 127.0.0.1:6379: connection refused")

// action is what the function passed to Do does in a step.
type action int

const (
	succeed  action = iota // returns nil
	fail                   // returns errRedis
	answered               // returns Answered(errRedis)
	timeout                // waits for its ctx (CallTimeout) and returns ctx.Err()
	cancel                 // the caller's ctx is cancelled; returns ctx.Err()
)

func (a action) String() string {
	return [...]string{"succeed", "fail", "answered", "timeout", "cancel"}[a]
}

// do calls b.Do with a function that performs a, and reports whether the
// function was called and what Do returned.
func do(b *breaker.Breaker, a action) (called bool, err error) {
	ctx := context.Background()
	if a == cancel {
		c, stop := context.WithCancel(ctx)
		stop()
		ctx = c
	}
	err = b.Do(ctx, func(ctx context.Context) error {
		called = true
		switch a {
		case succeed:
			return nil
		case fail:
			return errRedis
		case answered:
			return breaker.Answered(errRedis)
		default: // timeout, cancel
			<-ctx.Done()
			return ctx.Err()
		}
	})
	return called, err
}

// wantErr is the error Do returns when the function performs a.
func wantErr(a action) error {
	switch a {
	case succeed:
		return nil
	case fail, answered:
		return errRedis
	case timeout:
		return context.DeadlineExceeded
	default:
		return context.Canceled
	}
}

func mustNew(t *testing.T, cfg breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) error = %v", cfg, err)
	}
	return b
}

// trip fails calls until b opens.
func trip(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	for i := 0; b.State() != breaker.Open; i++ {
		if i == 1000 {
			t.Fatalf("breaker still %v after %d failures", b.State(), i)
		}
		do(b, fail)
	}
}

func TestSteps(t *testing.T) {
	const openTimeout = time.Second
	type step struct {
		wait    time.Duration // bubble time to let pass before the call
		act     action
		refused bool // Do returns ErrOpen without calling the function
		state   breaker.State
	}
	tests := []struct {
		name          string
		cfg           breaker.Config
		steps         []step
		trips, reject uint64
	}{
		{
			name: "consecutive failures trip",
			cfg:  breaker.Config{ConsecutiveFailures: 3, MinRequests: 100},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Open},
				{act: succeed, refused: true, state: breaker.Open},
				{act: fail, refused: true, state: breaker.Open},
			},
			trips: 1, reject: 2,
		},
		{
			name: "successes reset the consecutive count",
			cfg:  breaker.Config{ConsecutiveFailures: 3, MinRequests: 100},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: answered, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Open},
			},
			trips: 1,
		},
		{
			name: "failure ratio trips once MinRequests calls have an outcome",
			cfg:  breaker.Config{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 6},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: cancel, state: breaker.Closed}, // excluded: not a call with an outcome
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Open}, // 4 of 6
			},
			trips: 1,
		},
		{
			name: "failure ratio below FailureRatio does not trip",
			cfg:  breaker.Config{ConsecutiveFailures: 100, FailureRatio: 0.4, MinRequests: 5},
			steps: []step{
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Closed}, // 2 of 6
				{act: fail, state: breaker.Open},   // 3 of 7
			},
			trips: 1,
		},
		{
			name: "failure ratio at 0.3 trips on exactly 3 of 10",
			cfg:  breaker.Config{ConsecutiveFailures: 100, FailureRatio: 0.3, MinRequests: 10},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Open},
			},
			trips: 1,
		},
		{
			name: "failures older than Interval age out",
			cfg:  breaker.Config{ConsecutiveFailures: 3, MinRequests: 100, Interval: 10 * time.Second},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{wait: 5 * time.Second, act: fail, state: breaker.Closed},
				{wait: 6 * time.Second, act: fail, state: breaker.Closed}, // the first has aged out
				{wait: 3 * time.Second, act: fail, state: breaker.Open},
			},
			trips: 1,
		},
		{
			name: "half-open probe success closes",
			cfg:  breaker.Config{ConsecutiveFailures: 2, OpenTimeout: openTimeout},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Open},
				{wait: openTimeout / 2, act: succeed, refused: true, state: breaker.Open},
				{wait: openTimeout / 2, act: succeed, refused: true, state: breaker.Open}, // open for all of OpenTimeout
				{wait: time.Nanosecond, act: succeed, state: breaker.Closed},
				{act: fail, state: breaker.Closed}, // counts start afresh
			},
			trips: 1, reject: 2,
		},
		{
			name: "half-open probe failure re-opens",
			cfg:  breaker.Config{ConsecutiveFailures: 2, OpenTimeout: openTimeout},
			steps: []step{
				{act: fail, state: breaker.Closed},
				{act: fail, state: breaker.Open},
				{wait: openTimeout + 1, act: fail, state: breaker.Open},
				{act: succeed, refused: true, state: breaker.Open},
				{wait: openTimeout + 1, act: timeout, state: breaker.Open},
				{wait: openTimeout + 1, act: succeed, state: breaker.Closed},
			},
			trips: 3, reject: 1,
		},
		{
			name: "all half-open probes must succeed",
			cfg:  breaker.Config{ConsecutiveFailures: 1, OpenTimeout: openTimeout, HalfOpenProbes: 3},
			steps: []step{
				{act: fail, state: breaker.Open},
				{wait: openTimeout + 1, act: succeed, state: breaker.HalfOpen},
				{act: succeed, state: breaker.HalfOpen},
				{act: fail, state: breaker.Open},
				{wait: openTimeout + 1, act: succeed, state: breaker.HalfOpen},
				{act: answered, state: breaker.HalfOpen},
				{act: cancel, state: breaker.HalfOpen}, // excluded: frees its place
				{act: succeed, state: breaker.Closed},
			},
			trips: 2,
		},
		{
			name: "Answered errors never trip",
			cfg:  breaker.Config{ConsecutiveFailures: 1, FailureRatio: 0.01, MinRequests: 1},
			steps: []step{
				{act: answered, state: breaker.Closed},
				{act: answered, state: breaker.Closed},
				{act: answered, state: breaker.Closed},
				{act: fail, state: breaker.Open},
			},
			trips: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(t, tt.cfg)
				for i, s := range tt.steps {
					time.Sleep(s.wait)
					called, err := do(b, s.act)
					if s.refused {
						if !errors.Is(err, breaker.ErrOpen) || called {
							t.Fatalf("step %d: Do(%v) = %v, called %v; want ErrOpen, not called", i, s.act, err, called)
						}
					} else if want := wantErr(s.act); !errors.Is(err, want) || (want == nil) != (err == nil) || !called {
						t.Fatalf("step %d: Do(%v) = %v, called %v; want %v, called", i, s.act, err, called, want)
					}
					if got := b.State(); got != s.state {
						t.Fatalf("step %d: after Do(%v), State() = %v, want %v", i, s.act, got, s.state)
					}
				}
				c := b.Counts()
				if c.Trips != tt.trips || c.Rejected != tt.reject {
					t.Errorf("Counts() Trips, Rejected = %d, %d; want %d, %d", c.Trips, c.Rejected, tt.trips, tt.reject)
				}
			})
		})
	}
}

func TestDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, breaker.Config{})
		start := time.Now()
		err := b.Do(context.Background(), func(ctx context.Context) error {
			deadline, ok := ctx.Deadline()
			if want := start.Add(breaker.DefaultCallTimeout); !ok || !deadline.Equal(want) {
				t.Errorf("ctx.Deadline() = %v, %v; want %v, true", deadline, ok, want)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Do = %v, want nil", err)
		}
		for i := range breaker.DefaultConsecutiveFailures {
			if got := b.State(); got != breaker.Closed {
				t.Fatalf("State() after %d failures = %v, want closed", i, got)
			}
			do(b, fail)
		}
		if got := b.State(); got != breaker.Open {
			t.Fatalf("State() after %d failures = %v, want open", breaker.DefaultConsecutiveFailures, got)
		}
		time.Sleep(breaker.DefaultOpenTimeout)
		if got := b.State(); got != breaker.Open {
			t.Fatalf("State() after DefaultOpenTimeout = %v, want open", got)
		}
		time.Sleep(time.Nanosecond)
		if got := b.State(); got != breaker.HalfOpen {
			t.Fatalf("State() after DefaultOpenTimeout+1ns = %v, want half-open", got)
		}
	})
}

// TestConcurrentProbes holds the half-open probes inside their calls and
// checks that the calls made meanwhile are refused.
func TestConcurrentProbes(t *testing.T) {
	for _, tt := range []struct {
		name   string
		probes []action // one per probe, performed once all are in flight
		state  breaker.State
	}{
		{"all succeed", []action{succeed, succeed}, breaker.Closed},
		{"one fails", []action{succeed, fail}, breaker.Open},
		{"one is cancelled", []action{succeed, cancel}, breaker.HalfOpen},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(t, breaker.Config{HalfOpenProbes: uint32(len(tt.probes))})
				trip(t, b)
				time.Sleep(breaker.DefaultOpenTimeout + 1)

				var wg sync.WaitGroup
				release := make([]chan struct{}, len(tt.probes))
				for i, a := range tt.probes {
					release[i] = make(chan struct{})
					ctx, stop := context.WithCancel(context.Background())
					defer stop()
					wg.Go(func() {
						err := b.Do(ctx, func(callCtx context.Context) error {
							<-release[i]
							switch a {
							case fail:
								return errRedis
							case cancel:
								stop()
								return ctx.Err()
							}
							return nil
						})
						if want := wantErr(a); err != want {
							t.Errorf("probe %d: Do = %v, want %v", i, err, want)
						}
					})
				}
				synctest.Wait() // every probe is in flight

				for i := range 3 {
					called, err := do(b, succeed)
					if !errors.Is(err, breaker.ErrOpen) || called {
						t.Fatalf("call %d while probing: Do = %v, called %v; want ErrOpen, not called", i, err, called)
					}
				}
				if got := b.State(); got != breaker.HalfOpen {
					t.Fatalf("State() while probing = %v, want half-open", got)
				}
				for _, r := range release {
					close(r)
					synctest.Wait()
				}
				wg.Wait()
				if got := b.State(); got != tt.state {
					t.Errorf("State() after the probes = %v, want %v", got, tt.state)
				}
				if got := b.Counts().Rejected; got != 3 {
					t.Errorf("Counts().Rejected = %d, want 3", got)
				}
			})
		})
	}
}

func TestCallerCancellationIsNotAFailure(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(t, breaker.Config{ConsecutiveFailures: 3, MinRequests: 1})
			for i := range 10 {
				called, err := do(b, cancel)
				if !called || err != context.Canceled {
					t.Fatalf("call %d: Do = %v, called %v; want %v, called", i, err, called, context.Canceled)
				}
			}
			if got := b.State(); got != breaker.Closed {
				t.Errorf("State() = %v, want closed", got)
			}
			want := breaker.Counts{Requests: 10, TotalExclusions: 10}
			if got := b.Counts(); got != want {
				t.Errorf("Counts() = %+v, want %+v", got, want)
			}
		})
	})

	t.Run("caller deadline before CallTimeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const callerTimeout = 10 * time.Millisecond
			b := mustNew(t, breaker.Config{ConsecutiveFailures: 3, CallTimeout: time.Second})
			for i := range 10 {
				ctx, stop := context.WithTimeout(context.Background(), callerTimeout)
				start := time.Now()
				err := b.Do(ctx, func(ctx context.Context) error {
					<-ctx.Done()
					return ctx.Err()
				})
				stop()
				if err != context.DeadlineExceeded {
					t.Fatalf("call %d: Do = %v, want %v", i, err, context.DeadlineExceeded)
				}
				if got := time.Since(start); got != callerTimeout {
					t.Fatalf("call %d took %v, want %v", i, got, callerTimeout)
				}
			}
			if got := b.State(); got != breaker.Closed {
				t.Errorf("State() = %v, want closed", got)
			}
			if got := b.Counts().TotalExclusions; got != 10 {
				t.Errorf("Counts().TotalExclusions = %d, want 10", got)
			}
		})
	})

	t.Run("a reply after the caller gave up still counts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(t, breaker.Config{})
			for i, reply := range []error{nil, breaker.Answered(errRedis)} {
				ctx, stop := context.WithCancel(context.Background())
				err := b.Do(ctx, func(context.Context) error {
					stop() // the caller gives up while Redis is answering
					return reply
				})
				if err != reply {
					t.Errorf("call %d: Do = %v, want %v", i, err, reply)
				}
			}
			if got := b.Counts(); got.TotalSuccesses != 2 || got.TotalExclusions != 0 {
				t.Errorf("Counts() successes, exclusions = %d, %d; want 2, 0", got.TotalSuccesses, got.TotalExclusions)
			}
		})
	})

	t.Run("cancelled half-open probe", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(t, breaker.Config{})
			trip(t, b)
			time.Sleep(breaker.DefaultOpenTimeout + 1)

			// Cancelled before the call.
			if called, err := do(b, cancel); !called || err != context.Canceled {
				t.Fatalf("probe: Do = %v, called %v; want %v, called", err, called, context.Canceled)
			}
			if got := b.State(); got != breaker.HalfOpen {
				t.Fatalf("State() after a cancelled probe = %v, want half-open", got)
			}

			// Cancelled while in flight.
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				b.Do(ctx, func(ctx context.Context) error {
					<-ctx.Done()
					return ctx.Err()
				})
			})
			synctest.Wait()
			if called, err := do(b, succeed); !errors.Is(err, breaker.ErrOpen) || called {
				t.Fatalf("call while probing: Do = %v, called %v; want ErrOpen, not called", err, called)
			}
			stop()
			wg.Wait()
			if got := b.State(); got != breaker.HalfOpen {
				t.Fatalf("State() after a cancelled probe = %v, want half-open", got)
			}

			if called, err := do(b, succeed); !called || err != nil {
				t.Fatalf("probe: Do = %v, called %v; want nil, called", err, called)
			}
			if got := b.State(); got != breaker.Closed {
				t.Errorf("State() after a successful probe = %v, want closed", got)
			}
		})
	})
}

// TestCallTimeoutIsAFailure: with a fixed deadline (MaxCallTimeout at
// CallTimeout), a call that runs out of it while no other call succeeds is
// a failure, and three in a row trip the breaker. With deadlines that adapt,
// only once Redis has been silent for MaxCallTimeout (TestSilence).
func TestCallTimeoutIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const callTimeout = 20 * time.Millisecond
		b := mustNew(t, breaker.Config{ConsecutiveFailures: 3, CallTimeout: callTimeout, MaxCallTimeout: callTimeout})
		// The caller's deadline is later than CallTimeout: the call's own one wins.
		ctx, stop := context.WithTimeout(context.Background(), time.Hour)
		defer stop()
		start := time.Now()
		for i, want := range []breaker.State{breaker.Closed, breaker.Closed, breaker.Open} {
			err := b.Do(ctx, func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			})
			if err != context.DeadlineExceeded {
				t.Fatalf("call %d: Do = %v, want %v", i, err, context.DeadlineExceeded)
			}
			if got := b.State(); got != want {
				t.Fatalf("State() after call %d = %v, want %v", i, got, want)
			}
		}
		if got, want := time.Since(start), 3*callTimeout; got != want {
			t.Errorf("3 timed out calls took %v, want %v", got, want)
		}
		if got := b.Counts(); got.Trips != 1 {
			t.Errorf("Counts().Trips = %d, want 1", got.Trips)
		}
	})
}

// replyError stands for a Redis error reply type.
type replyError struct{ msg string }

func (e *replyError) Error() string { return e.msg }

func TestAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, breaker.Config{ConsecutiveFailures: 1})
		original := &replyError{"WRONGTYPE Operation against a key holding the wrong kind of value"}
		for i, f := range []func(context.Context) error{
			func(context.Context) error { return breaker.Answered(original) },
			func(context.Context) error { return fmt.Errorf("global: settle: %w", breaker.Answered(original)) },
			func(context.Context) error { return errors.Join(errors.New("other"), breaker.Answered(original)) },
		} {
			got := b.Do(context.Background(), f)
			if !errors.Is(got, original) {
				t.Errorf("call %d: errors.Is(%v, original) = false, want true", i, got)
			}
			var re *replyError
			if !errors.As(got, &re) || re != original {
				t.Errorf("call %d: errors.As(%v, *replyError) = %v, want original", i, got, re)
			}
			if !strings.Contains(got.Error(), original.msg) {
				t.Errorf("call %d: Do(...).Error() = %q, want it to contain %q", i, got.Error(), original.msg)
			}
		}
		if got := b.Do(context.Background(), func(context.Context) error { return breaker.Answered(original) }); got.Error() != original.Error() {
			t.Errorf("Answered(err).Error() = %q, want %q", got.Error(), original.Error())
		}
		if got := b.State(); got != breaker.Closed {
			t.Errorf("State() = %v, want closed", got)
		}
		if got := b.Counts(); got.TotalSuccesses != 4 || got.TotalFailures != 0 {
			t.Errorf("Counts() successes, failures = %d, %d; want 4, 0", got.TotalSuccesses, got.TotalFailures)
		}
		if got := breaker.Answered(nil); got != nil {
			t.Errorf("Answered(nil) = %v, want nil", got)
		}
	})
}

func TestErrOpenNamesTheBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, breaker.Config{Name: "cache", ConsecutiveFailures: 1})
		do(b, fail)
		_, err := do(b, succeed)
		if want := "breaker: cache: open"; err == nil || err.Error() != want {
			t.Errorf("Do on an open breaker = %v, want %q", err, want)
		}
	})
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  breaker.Config
		ok   bool
	}{
		{"zero", breaker.Config{}, true},
		{"all set", breaker.Config{
			ConsecutiveFailures: 5, FailureRatio: 0.25, MinRequests: 20,
			Interval: time.Minute, OpenTimeout: 5 * time.Second, HalfOpenProbes: 3,
			CallTimeout: time.Second, Name: "r",
		}, true},
		{"ratio 1", breaker.Config{FailureRatio: 1}, true},
		{"tiny ratio", breaker.Config{FailureRatio: math.SmallestNonzeroFloat64}, true},
		{"tiny interval", breaker.Config{Interval: time.Nanosecond}, true},
		{"negative ratio", breaker.Config{FailureRatio: -0.1}, false},
		{"ratio above 1", breaker.Config{FailureRatio: 1.5}, false},
		{"NaN ratio", breaker.Config{FailureRatio: math.NaN()}, false},
		{"infinite ratio", breaker.Config{FailureRatio: math.Inf(1)}, false},
		{"negative Interval", breaker.Config{Interval: -time.Second}, false},
		{"negative OpenTimeout", breaker.Config{OpenTimeout: -1}, false},
		{"negative CallTimeout", breaker.Config{CallTimeout: -time.Millisecond}, false},
		{"negative MaxCallTimeout", breaker.Config{MaxCallTimeout: -time.Millisecond}, false},
		{"MaxCallTimeout below CallTimeout", breaker.Config{CallTimeout: time.Second, MaxCallTimeout: time.Millisecond}, true},
	}
	for _, tt := range tests {
		b, err := breaker.New(tt.cfg)
		if tt.ok {
			if err != nil || b == nil {
				t.Errorf("%s: New(%+v) = %v, %v; want a Breaker, nil", tt.name, tt.cfg, b, err)
			}
			continue
		}
		if !errors.Is(err, breaker.ErrConfig) || b != nil {
			t.Errorf("%s: New(%+v) = %v, %v; want nil, ErrConfig", tt.name, tt.cfg, b, err)
		}
	}
}

func TestStateString(t *testing.T) {
	for _, tt := range []struct {
		s    breaker.State
		want string
	}{
		{breaker.Closed, "closed"},
		{breaker.HalfOpen, "half-open"},
		{breaker.Open, "open"},
		{breaker.State(7), "breaker.State(7)"},
	} {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("State(%d).String() = %q, want %q", int(tt.s), got, tt.want)
		}
	}
}

func BenchmarkDo(b *testing.B) {
	br, err := breaker.New(breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	f := func(context.Context) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := br.Do(ctx, f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDoOpen(b *testing.B) {
	br, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	br.Do(ctx, func(context.Context) error { return errRedis })
	f := func(context.Context) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := br.Do(ctx, f); !errors.Is(err, breaker.ErrOpen) {
			b.Fatal(err)
		}
	}
}
