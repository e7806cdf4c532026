package global_test

import (
	"fmt"
	"testing"

	"github.com/hybridlimit/hybrid/global"
)

// TestLoad: after Load, a Limiter's first Settle sends the script's hash
// (EVALSHA), not its source, on a Redis that had no script cached, and on
// every master of a Cluster; a Redis that lost its scripts since (a
// restart, a failover) answers NOSCRIPT and the call is sent again with the
// source, as without Load.
func TestLoad(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l := newLimiter(t, b)
		if err := l.Load(ctx); err != nil {
			t.Fatalf("Load = %v", err)
		}
		batch := []global.Settlement{
			{Key: "a", Limit: slow, Want: M, MinGrant: M},
			{Key: "b", Limit: slow, Want: M, MinGrant: M},
		}
		replies := make([]global.Reply, len(batch))
		n := 1 // one call carries the keys; on a Cluster, a call each
		if l.Spread() {
			n = len(batch)
		}
		b.log.take()
		settle := func(what, want string) {
			t.Helper()
			if err := l.Settle(ctx, batch, replies); err != nil {
				t.Fatalf("Settle %s = %v", what, err)
			}
			for k, r := range replies {
				if r.Err != nil || r.Granted != M {
					t.Errorf("Settle %s: reply %d = %+v, want granted %d", what, k, r, M)
				}
			}
			if got := b.log.take(); got != want {
				t.Errorf("Settle %s sent %q, want %q", what, got, want)
			}
		}
		settle("after Load", fmt.Sprintf("evalsha=%d", n))
		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		settle("after a flush", fmt.Sprintf("evalsha NOSCRIPT=%d eval=%d", n, n))
	})
}
