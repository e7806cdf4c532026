package global_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
)

// TestSettleOutage checks that Since and Claim reach the script, alone and
// in a call of many keys with settlements that have none: a missing bucket
// (expired once full, after an outage that began 14 s ago; burst 10, 1
// token/s) credits up to 4 tokens of what is claimed; a settlement
// without a Since is charged in full beside it.
func TestSettleOutage(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		now := redisNow(ctx, t, b.rdb, l.Key("x"))
		lim := limit.MicroLimit{Rate: M, Burst: 10 * M}
		since := now.Add(-14 * time.Second)
		batch := []global.Settlement{
			{Key: "alone", Limit: lim, Consumed: 6 * M, Debt: 50 * M, Instance: "i", Seq: 1, Since: since, Claim: 5 * M},
		}
		many := []global.Settlement{
			{Key: "a", Limit: lim, Consumed: 6 * M, Debt: 50 * M, Instance: "i", Seq: 2, Since: since, Claim: 5 * M},
			{Key: "b", Limit: lim, Consumed: 6 * M, Debt: 50 * M, Instance: "i", Seq: 2},
			{Key: "c", Limit: lim, Consumed: 6 * M, Debt: 50 * M, Instance: "i", Seq: 2, Since: since, Claim: 2 * M},
		}
		want := []int64{8 * M, 8 * M, 4 * M, 6 * M} // 10 - 6 + the credit
		for i, batch := range [][]global.Settlement{batch, many} {
			replies := make([]global.Reply, len(batch))
			if err := l.Settle(ctx, batch, replies); err != nil {
				t.Fatal(err)
			}
			for j, r := range replies {
				w := want[j+i]
				// A real clock adds to the pool between reading now and settling.
				if r.Err != nil || r.Tokens < w || r.Tokens > w+M/10 {
					t.Errorf("%s: reply %+v, want %d tokens", batch[j].Key, r, w)
				}
			}
		}
	})
}
