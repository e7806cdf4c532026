package global_test

import (
	"fmt"
	"testing"
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
		settle, n := sentBy(t, l, b)
		settle("after Load", fmt.Sprintf("evalsha=%d", n))
		if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		settle("after a flush", fmt.Sprintf("evalsha NOSCRIPT=%d eval=%d", n, n))
	})
}
