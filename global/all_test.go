package global_test

import (
	"errors"
	"testing"

	"github.com/hybridlimit/hybrid/global"
)

// TestSettleAll: a composite decision in one call, all or nothing, on
// miniredis and a real redis-server; ErrSpread on the Cluster.
func TestSettleAll(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		lim := global.Limit{Rate: 1e-3, Burst: 3}
		user, _ := global.Decision("user", lim, 1)
		route, _ := global.Decision("route", global.Limit{Rate: 1e-3, Burst: 10}, 4)
		batch := []global.Settlement{user, route}
		replies := make([]global.Reply, 2)
		if l.Spread() {
			if err := l.SettleAll(ctx, batch, replies); !errors.Is(err, global.ErrSpread) {
				t.Fatalf("SettleAll on a Cluster = %v, want %v", err, global.ErrSpread)
			}
			return
		}
		// route: 10, 6, 2, then short; user: 3, 2, 1, 0.
		for i, want := range []bool{true, true, false} {
			if err := l.SettleAll(ctx, batch, replies); err != nil {
				t.Fatal(err)
			}
			u, r := global.Outcome(user, lim, replies[0]), replies[1]
			if u.Allowed != want || (r.Granted > 0) != want {
				t.Errorf("call %d: user %+v, route %+v; want both allowed %v", i, u, r, want)
			}
		}
		// The third took nothing from user: it still holds its last token.
		if res, err := l.Allow(ctx, "user", lim, 1); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Errorf("user after the denied composite: %+v, %v; want its last token", res, err)
		}
		bad := []global.Settlement{user, user}
		if err := l.SettleAll(ctx, bad, replies); !errors.Is(err, global.ErrInvalidCost) {
			t.Errorf("a key twice: %v, want %v", err, global.ErrInvalidCost)
		}
	})
}
