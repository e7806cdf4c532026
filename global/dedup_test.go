package global_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

// loseReplies is a go-redis hook that, while on, lets every pipeline reach
// Redis and then throws its replies away, as a connection killed after Redis
// ran the commands does: each command gets an error that is no reply.
type loseReplies struct {
	on bool // set between calls, never during one
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !h.on {
			return err
		}
		for _, cmd := range cmds {
			cmd.SetErr(io.ErrUnexpectedEOF)
		}
		return io.ErrUnexpectedEOF
	}
}

// bucket returns the stored tokens of the bucket of key, and its record for
// instance ("" if none).
func bucket(ctx context.Context, t *testing.T, b backend, l *global.Limiter, key, instance string) (string, string) {
	t.Helper()
	tokens, _, ok, err := redistest.Bucket(ctx, b.rdb, l.Key(key))
	if err != nil || !ok {
		t.Fatalf("bucket %s: %v, %v", key, ok, err)
	}
	var rec string
	if b.rdb.Type(ctx, l.Key(key)).Val() == "hash" {
		rec = b.rdb.HGet(ctx, l.Key(key), "q:"+instance).Val()
	}
	return fmt.Sprint(tokens), rec
}

// TestSettleResend loses the replies of a settlement round that Redis ran
// and sends the round again, as it was: every key with a Seq is a
// Duplicate with the Granted Redis gave the first time and a bucket charged
// once; a key without a Seq is charged twice, as before. On the cluster the
// keys are spread over the three masters.
func TestSettleResend(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		lose := &loseReplies{}
		b.rdb.AddHook(lose)

		const inst = "host-1.a_B"
		var seq int64 = 100 // one counter over all keys
		round := func(consumed, want int64, keys int, noSeq bool) []global.Settlement {
			batch := make([]global.Settlement, keys)
			for i := range batch {
				seq++
				batch[i] = global.Settlement{Key: fmt.Sprintf("user%d", i), Limit: slow, Consumed: consumed, Want: want, MinGrant: 1,
					Instance: inst, Seq: seq}
			}
			if noSeq {
				batch[len(batch)-1].Seq = 0
			}
			return batch
		}
		const keys = 30
		batch := round(2*M, 3*M, keys, true)
		replies := make([]global.Reply, keys)

		var err error
		// Cache the script on every master first: a NOSCRIPT reply lost
		// would look as if Redis had not run the round.
		load := func(ctx context.Context, c *redis.Client) error { return c.ScriptLoad(ctx, lua.Settle).Err() }
		if cc, ok := b.rdb.(*redis.ClusterClient); ok {
			err = cc.ForEachMaster(ctx, load)
		} else {
			err = load(ctx, b.rdb.(*redis.Client))
		}
		if err != nil {
			t.Fatal(err)
		}
		lose.on = true
		err = l.Settle(ctx, batch, replies)
		lose.on = false
		if err == nil || !errors.Is(replies[0].Err, io.ErrUnexpectedEOF) {
			t.Fatalf("Settle with its replies lost = %v, %+v; want %v", err, replies[0], io.ErrUnexpectedEOF)
		}
		// Redis ran it: 10 - 2 - 3 = 5 tokens in each bucket.
		for i, s := range batch {
			tokens, rec := bucket(ctx, t, b, l, s.Key, inst)
			if tokens != fmt.Sprint(5*M) {
				t.Fatalf("key %d: stored t = %q after the lost round, want %d: Redis ran it", i, tokens, 5*M)
			}
			if wantRec := fmt.Sprintf("%d %d ", s.Seq, 3*M); s.Seq > 0 && !strings.HasPrefix(rec, wantRec) || s.Seq == 0 && rec != "" {
				t.Errorf("key %d: record %q, want %q and a time (none without a Seq)", i, rec, wantRec)
			}
		}

		// The same round again.
		if err := l.Settle(ctx, batch, replies); err != nil {
			t.Fatalf("Settle again = %v", err)
		}
		for i, r := range replies {
			if batch[i].Seq == 0 {
				// Applied twice: charged 2 more and granted 3 more.
				if r.Err != nil || r.Duplicate || r.Granted != 3*M || !about(r.Tokens, 0) {
					t.Errorf("key %d without a Seq, again: %+v, want applied again: granted %d, tokens 0", i, r, 3*M)
				}
				continue
			}
			if r.Err != nil || !r.Duplicate || r.Reset || r.Granted != 3*M || !about(r.Tokens, 5*M) {
				t.Errorf("key %d sent again: %+v, want a Duplicate granted %d, tokens %d", i, r, 3*M, 5*M)
			}
			if tokens, _ := bucket(ctx, t, b, l, batch[i].Key, inst); tokens != fmt.Sprint(5*M) {
				t.Errorf("key %d: stored t = %q after the duplicate, want %d unchanged", i, tokens, 5*M)
			}
		}

		// A later round applies; the first one sent again is superseded.
		next := round(M, M, keys, false)
		if err := l.Settle(ctx, next, replies); err != nil {
			t.Fatal(err)
		}
		for i, r := range replies[:keys-1] {
			if r.Err != nil || r.Duplicate || r.Granted != M || !about(r.Tokens, 3*M) {
				t.Errorf("key %d, next round: %+v, want applied: granted %d, tokens %d", i, r, M, 3*M)
			}
		}
		if err := l.Settle(ctx, batch[:keys-1], replies); err != nil {
			t.Fatal(err)
		}
		for i, r := range replies[:keys-1] {
			if r.Err != nil || !r.Duplicate || !r.Superseded || r.Granted != 0 || !about(r.Tokens, 3*M) {
				t.Errorf("key %d, the first round again after the next: %+v, want a Superseded Duplicate granted 0, tokens %d", i, r, 3*M)
			}
		}

		// A second instance on the same keys, with seqs far below the
		// first's, has records of its own: applied once, then duplicates.
		other := append([]global.Settlement(nil), next[:keys-1]...)
		for i := range other {
			other[i].Instance, other[i].Seq = "host-2", int64(i+1)
		}
		for range 2 {
			if err := l.Settle(ctx, other, replies); err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range replies[:keys-1] {
			if r.Err != nil || !r.Duplicate || r.Granted != M || !about(r.Tokens, M) {
				t.Errorf("key %d, host-2 twice: %+v, want a Duplicate granted %d, tokens %d: applied once", i, r, M, M)
			}
			_, rec1 := bucket(ctx, t, b, l, other[i].Key, inst)
			_, rec2 := bucket(ctx, t, b, l, other[i].Key, "host-2")
			if !strings.HasPrefix(rec1, fmt.Sprintf("%d ", next[i].Seq)) || !strings.HasPrefix(rec2, fmt.Sprintf("%d ", i+1)) {
				t.Errorf("key %d: records %q and %q, want seqs %d and %d", i, rec1, rec2, next[i].Seq, i+1)
			}
		}

		// Allow sends no seq: it writes no record, and its reply parses.
		if r, err := l.Allow(ctx, "exact", global.Limit{Rate: 1, Burst: 2}, 1); err != nil || !r.Allowed {
			t.Fatalf("Allow = %+v, %v", r, err)
		}
		if typ, err := b.rdb.Type(ctx, l.Key("exact")).Result(); err != nil || typ != "string" {
			t.Errorf("Allow wrote a %s, %v; want a string: a bucket with no record", typ, err)
		}
	})
}
