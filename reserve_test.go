package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// Reservations: Reserve, OK, Cancel, and what a cancelled reservation gives
// back in each mode.

// TestReserveCancel: an allowed reservation that is cancelled gives its
// token back, so that a later request is allowed where it would have been
// denied; a second Cancel and the Cancel of a denied reservation do
// nothing; Redis is charged, in the end, for the tokens kept. An Exact limit
// was charged in Redis by its script call: the token goes back there at the
// next round, as Cancel does no I/O. While Redis is unreachable, the token
// goes back to the fallback's local bucket.
func TestReserveCancel(t *testing.T) {
	tests := []struct {
		name string
		mode hybrid.Mode
		down bool // Redis unreachable: the fallback's local bucket decides
	}{
		{"lease", hybrid.Lease, false},
		{"optimistic", hybrid.Optimistic, false},
		{"exact", hybrid.Exact, false},
		{"fallback", hybrid.Lease, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				mode := tt.mode
				lim := hybrid.Limit{Rate: slow, Burst: 2, Mode: mode}
				ctx := context.Background()
				start := time.Now()
				f.setDown(tt.down)
				// back is how long a cancelled token takes to be usable.
				var back time.Duration
				if mode == hybrid.Exact {
					back = interval
				}
				allow := func(step string, want bool) {
					t.Helper()
					res, err := l.Allow(ctx, "k", lim)
					if err != nil || res.Allowed != want {
						t.Errorf("%s: Allow = %+v, %v, want allowed %v", step, res, err, want)
					}
					if tt.down && res.Source != hybrid.SourceFallback {
						t.Errorf("%s: Allow from %v, want fallback", step, res.Source)
					}
				}
				reserve := func(step string, want bool) *hybrid.Reservation {
					t.Helper()
					r, err := l.Reserve(ctx, "k", lim, 1)
					if err != nil {
						t.Fatalf("%s: Reserve: %v", step, err)
					}
					if r.OK() != want || r.Result().Allowed != want {
						t.Errorf("%s: Reserve: OK() = %v, Result %+v, want allowed %v", step, r.OK(), r.Result(), want)
					}
					return r
				}

				allow("first token", true)
				r := reserve("second token", true)
				allow("bucket empty", false)
				r.Cancel()
				settle(back)
				allow("after Cancel", true)
				allow("after Cancel, bucket empty again", false)

				// The token given back is spent again: a second Cancel must
				// not give it back twice.
				r.Cancel()
				settle(back)
				allow("after a second Cancel", false)

				// A token 1000 s away is not had within a second: nothing
				// is taken, and Cancel has nothing to give back.
				soon, cancel := context.WithTimeout(ctx, time.Second)
				d, err := l.Reserve(soon, "k", lim, 1)
				cancel()
				if err != nil || d.OK() || d.Delay() != hybrid.InfDuration {
					t.Fatalf("bucket empty, a second to wait: Reserve = %+v (delay %v), %v; want not OK", d.Result(), d.Delay(), err)
				}
				d.Cancel()
				settle(back)
				allow("after the Cancel of a denied reservation", false)

				if st := l.Stats(); st.Refunds != 1 {
					t.Errorf("Stats().Refunds = %d, want 1", st.Refunds)
				}
				// Two tokens were kept: Redis is charged those, once.
				f.setDown(false)
				settle(2*openTimeout + 3*interval)
				slack := int64(slow*micro*time.Since(start).Seconds()) + 1
				wantTokens(t, f.m, "k", 0, slack)
			})
		})
	}
}

// TestCancelExact: an Exact reservation's Cancel gives its tokens back to
// Redis before it returns: 10 reservations cancelled on a fresh key of
// burst 10 leave all 10 tokens to the next decisions, with no round between.
func TestCancelExact(t *testing.T) {
	lim := hybrid.Limit{Rate: slow, Burst: 10, Mode: hybrid.Exact}
	inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		for i := range 10 {
			r, err := l.Reserve(ctx, "k", lim, 1)
			if err != nil || !r.OK() {
				t.Fatalf("Reserve #%d = %+v, %v, want allowed", i, r.Result(), err)
			}
			r.Cancel()
		}
		allowed := 0
		for range 20 {
			if res, err := l.Allow(ctx, "k", lim); err == nil && res.Allowed {
				allowed++
			}
		}
		if allowed != 10 {
			t.Errorf("after 10 cancelled reservations, %d of 20 allowed at once, want 10", allowed)
		}
		if st := l.Stats(); st.Refunds != 10 || st.Reconcile.Rounds != 0 {
			t.Errorf("Refunds %d, Rounds %d, want 10 and no round", st.Refunds, st.Reconcile.Rounds)
		}
	})
}

// TestReserveAhead: a Reserve that AllowN would deny takes its token ahead
// of time, as x/time/rate's does: OK, with the Delay until it is due; the
// next one's comes a token's time later; a Cancel gives its token back, so
// that the next Reserve takes its place; one whose token would come after
// ctx's deadline takes nothing. Every mode.
func TestReserveAhead(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			lim := hybrid.Limit{Rate: 10, Burst: 1, Mode: mode}
			const each = 100 * time.Millisecond
			inFleet(t, 1, hybrid.Config{}, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				ctx := context.Background()
				reserve := func(step string, ctx context.Context, ok bool, delay time.Duration) *hybrid.Reservation {
					t.Helper()
					r, err := l.Reserve(ctx, "k", lim, 1)
					if err != nil {
						t.Fatalf("%s: Reserve: %v", step, err)
					}
					if r.OK() != ok || r.Delay() != delay || r.DelayFrom(time.Now().Add(delay)) != 0 && ok {
						t.Errorf("%s: Reserve = OK %v, Delay %v, want OK %v, Delay %v", step, r.OK(), r.Delay(), ok, delay)
					}
					return r
				}
				reserve("the burst", ctx, true, 0)
				first := reserve("a token's time away", ctx, true, each)
				reserve("two tokens' time away", ctx, true, 2*each)
				first.Cancel()
				// The bucket owes one token again: the next is due with the
				// one reserved before it (the tokens due by then are the
				// burst and two more, for three reservations kept).
				reserve("after one cancelled", ctx, true, 2*each)
				soon, cancel := context.WithTimeout(ctx, 2*each)
				defer cancel()
				if r := reserve("after the deadline", soon, false, hybrid.InfDuration); r.Result().RetryAfter <= 2*each {
					t.Errorf("a reservation not OK: RetryAfter %v, want the wait it would need, past the deadline", r.Result().RetryAfter)
				}
				// The reservations kept are 3 tokens: by 0.3 s the bucket
				// has given 4, one left for a request, and no more.
				time.Sleep(3 * each)
				if res, err := l.Allow(ctx, "k", lim); err != nil || !res.Allowed {
					t.Errorf("Allow once the reservations are due = %+v, %v; want the fourth token", res, err)
				}
				if res, err := l.Allow(ctx, "k", lim); err != nil || res.Allowed {
					t.Errorf("Allow after it = %+v, %v; want denied", res, err)
				}
			})
		})
	}
}
