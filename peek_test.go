package hybrid_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestPeek: a peek tells what a decision would, and takes nothing, in every
// mode. At a cold key it reads Redis once and writes nothing there; where
// the instance holds the tokens in its allowance it makes no round trip;
// after decisions it sees what they took; and the fleet admits, peeks or
// not, exactly the burst.
func TestPeek(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			inFleet(t, 2, hybrid.Config{Instances: 2}, func(t *testing.T, f *fleet) {
				a, b := f.lims[0], f.lims[1]
				ctx := context.Background()
				lim := hybrid.Limit{Rate: slow, Burst: 10, Mode: mode}
				peek := func(step string, l *hybrid.Limiter, n int64) hybrid.Result {
					t.Helper()
					res, err := l.Peek(ctx, "k", lim, n)
					if err != nil {
						t.Fatalf("%s: Peek(%d): %v", step, n, err)
					}
					return res
				}

				// A cold key: one read, nothing written (once Redis holds
				// the script: the first call sends it after NOSCRIPT).
				if _, err := a.Peek(ctx, "other", lim, 1); err != nil {
					t.Fatal(err)
				}
				before := f.commands()
				res := peek("cold", a, 3)
				if !res.Allowed || res.Remaining != 10 || res.Source != hybrid.SourceRedis || res.RetryAfter != 0 {
					t.Errorf("cold: Peek(3) = %+v, want allowed, 10 left, from Redis", res)
				}
				if n := f.commands() - before; n != 1 {
					t.Errorf("cold: a peek sent %d commands, want 1", n)
				}
				if f.m.Exists("hybrid:{k}") {
					t.Errorf("cold: a peek made the bucket in Redis")
				}
				if res, err := a.AllowN(ctx, "k", lim, 0); err != nil || !res.Allowed || res.Remaining != 10 {
					t.Errorf("cold: AllowN(0) = %+v, %v; want the peek's answer", res, err)
				}

				// Instance a takes 4; once settled, both see 6 left.
				admitted := 0
				for range 4 {
					if res, err := a.Allow(ctx, "k", lim); err == nil && res.Allowed {
						admitted++
					}
				}
				if res := peek("after 4", a, 1); mode != hybrid.Exact && res.Source == hybrid.SourceLocal {
					if !res.Allowed {
						t.Errorf("after 4: a local peek = %+v, want allowed", res)
					}
				}
				settle(5 * interval) // the leases and budgets go back idle
				for i, l := range f.lims {
					res := peek("settled", l, 7)
					if res.Allowed || res.Remaining != 6 || res.RetryAfter < 999*time.Second {
						t.Errorf("settled: instance %d: Peek(7) = %+v, want denied, 6 left, 1000 s to wait", i, res)
					}
				}

				// Peeks between the decisions change nothing: the fleet
				// admits the 6 left and no more.
				for range 12 {
					for _, l := range f.lims {
						peek("between", l, 1)
						if res, err := l.Allow(ctx, "k", lim); err == nil && res.Allowed {
							admitted++
						}
						settle(interval)
					}
				}
				if admitted != 10 {
					t.Errorf("the fleet admitted %d with peeks between, want the burst, 10", admitted)
				}
				if res := peek("spent", b, 1); res.Allowed || res.Remaining != 0 {
					t.Errorf("spent: Peek(1) = %+v, want denied, 0 left", res)
				}
			})
		})
	}
}

// TestPeekLocal: a lease that holds the tokens answers a peek with no round
// trip, and the peek spends nothing of it.
func TestPeekLocal(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		lim := hybrid.Limit{Rate: 1000, Burst: 1000}
		// A key in use grows its lease.
		for range 50 {
			if res, err := l.Allow(ctx, "hot", lim); err != nil || !res.Allowed {
				t.Fatalf("Allow = %+v, %v", res, err)
			}
		}
		settle(interval)
		before := f.commands()
		for range 100 {
			res, err := l.Peek(ctx, "hot", lim, 1)
			if err != nil || !res.Allowed || res.Source != hybrid.SourceLocal {
				t.Fatalf("Peek on a key holding a lease = %+v, %v; want allowed, local", res, err)
			}
		}
		if n := f.commands() - before; n != 0 {
			t.Errorf("peeks answered from the lease sent %d commands, want 0", n)
		}
	})
}

// TestPeekFallback: while Redis is down, a peek tells the fallback's local
// bucket, and takes nothing from it.
func TestPeekFallback(t *testing.T) {
	inFleet(t, 2, hybrid.Config{Instances: 2}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		lim := hybrid.Limit{Rate: slow, Burst: 10}
		f.setDown(true)
		admitted := 0
		for range 10 {
			res, err := l.Peek(ctx, "k", lim, 1)
			if err != nil || res.Source != hybrid.SourceFallback {
				t.Fatalf("Peek with Redis down = %+v, %v; want from the fallback", res, err)
			}
			if res.Remaining != int64(5-admitted) || res.Allowed != (admitted < 5) {
				t.Errorf("Peek with %d admitted = %+v, want %d left of the share", admitted, res, 5-admitted)
			}
			if res, _ := l.Allow(ctx, "k", lim); res.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Errorf("the fallback admitted %d with peeks between, want its share, 5", admitted)
		}
		f.setDown(false)
	})
}

// TestPeekInvalid: bad input is an error naming the key and the bound.
func TestPeekInvalid(t *testing.T) {
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		ctx := context.Background()
		lim := hybrid.Limit{Rate: 1, Burst: 10}
		for _, tt := range []struct {
			name string
			key  string
			lim  hybrid.Limit
			n    int64
			want error
		}{
			{"above the burst", "k", lim, 11, hybrid.ErrInvalidCost},
			{"negative", "k", lim, -1, hybrid.ErrInvalidCost},
			{"empty key", "", lim, 1, hybrid.ErrInvalidKey},
			{"zero rate", "k", hybrid.Limit{Burst: 1}, 1, hybrid.ErrInvalidLimit},
		} {
			if _, err := l.Peek(ctx, tt.key, tt.lim, tt.n); !errors.Is(err, tt.want) {
				t.Errorf("%s: Peek = %v, want %v", tt.name, err, tt.want)
			}
		}
		_, err := l.Peek(ctx, "k", lim, 11)
		if err == nil || !strings.Contains(err.Error(), `"k"`) || !strings.Contains(err.Error(), "burst 10") {
			t.Errorf("Peek above the burst: %v, want the key and the bound named", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := l.Peek(cctx, "k", lim, 1); !errors.Is(err, context.Canceled) {
			t.Errorf("Peek with a cancelled ctx: %v, want context.Canceled", err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Peek(ctx, "k", lim, 1); !errors.Is(err, hybrid.ErrClosed) {
			t.Errorf("Peek after Close: %v, want ErrClosed", err)
		}
	})
}
