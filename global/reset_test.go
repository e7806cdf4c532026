package global_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// TestReset: a bucket spent and in debt is full again after Reset, on every
// backend; bad arguments are errors, with nothing written.
func TestReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		lim := global.Limit{Rate: 0.001, Burst: 10}
		m, _ := lim.Micro()
		if _, err := l.TakeAhead(ctx, "u{1}", m, 10_000_000, 0); err != nil {
			t.Fatal(err)
		}
		if rep, err := l.TakeAhead(ctx, "u{1}", m, 5_000_000, 10_000_000); err != nil || rep.Tokens > -4_999_000 {
			t.Fatalf("TakeAhead into debt = %+v, %v", rep, err)
		}
		at, err := l.Reset(ctx, "u{1}", time.Second, time.Minute)
		if err != nil || at.IsZero() {
			t.Fatalf("Reset = %v, %v", at, err)
		}
		if res, err := l.Peek(ctx, "u{1}", lim, 10); err != nil || !res.Allowed || res.Remaining != 10 {
			t.Errorf("Peek after Reset = %+v, %v; want the burst", res, err)
		}
		for _, bad := range []struct{ grace, keep time.Duration }{{0, time.Second}, {2 * time.Second, time.Second}, {time.Second, 1 << 41 * time.Millisecond}} {
			if _, err := l.Reset(ctx, "v", bad.grace, bad.keep); err == nil {
				t.Errorf("Reset(grace %v, keep %v) = nil error", bad.grace, bad.keep)
			}
		}
		if _, err := l.Reset(ctx, "", time.Second, time.Second); err == nil {
			t.Error("Reset of an empty key = nil error")
		}
	})
}
