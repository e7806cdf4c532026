package reconcile_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/reconcile"
)

// redisReply is an error reply from Redis, as go-redis returns one.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// refusing is a store that, while refusal is set, answers every settlement
// with it as its own reply, as a Redis that refuses every write answers a
// multi-key call or a pipeline (the call itself succeeds), and fails every
// heartbeat with it. It counts the Settle calls it refused.
type refusing struct {
	*store
	mu      sync.Mutex // protects the fields below
	refusal error
	refused int
	only    string // if not "", only this key's settlement is refused
}

func (s *refusing) refuse(err error, only string) {
	s.mu.Lock()
	s.refusal, s.only = err, only
	s.mu.Unlock()
}

func (s *refusing) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	s.mu.Lock()
	err, only := s.refusal, s.only
	if err != nil {
		s.refused++
	}
	s.mu.Unlock()
	if err == nil {
		return s.store.Settle(ctx, batch, replies)
	}
	if only != "" {
		// The others' are applied.
		if err := s.store.Settle(ctx, batch, replies); err != nil {
			return err
		}
	}
	for i := range batch {
		if only == "" || batch[i].Key == only {
			replies[i] = global.Reply{Err: err}
		}
	}
	return nil
}

func (s *refusing) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, time.Time, error) {
	s.mu.Lock()
	err := s.refusal
	s.mu.Unlock()
	if err != nil {
		return 0, time.Time{}, err
	}
	return s.store.Heartbeat(ctx, id, ttl)
}

func (s *refusing) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// TestRefusedNode: a Redis that refuses every write (OOM: memory past
// maxmemory with noeviction; READONLY: a replica left behind) answers each
// settlement of a call with the error. Three refused calls open the
// breaker, as calls that got no reply would: decisions go to the fallback,
// a warning names the cause, Stats counts the refusals and names the cause
// while the breaker is open, and the refused settlements back off: 20s with
// a round every 100ms send 3 calls, then one probe a second (the breaker's
// OpenTimeout), not a call a round. When Redis takes writes again, the
// probe closes the breaker and the consumption kept meanwhile is charged.
func TestRefusedNode(t *testing.T) {
	tests := []struct {
		reply redisReply
		cause global.Cause
		text  string
	}{
		{"OOM command not allowed when used memory > 'maxmemory'. script: 9e6769c9edcae33737e9e9d049ec00d7cc07d648, on @user_script:1.", global.Full, "cause=maxmemory"},
		{"READONLY You can't write against a read only replica. script: 9e6769c9edcae33737e9e9d049ec00d7cc07d648, on @user_script:1.", global.ReadOnly, "cause=readonly"},
	}
	for _, tt := range tests {
		t.Run(tt.cause.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out logBuffer
				st := &refusing{store: newStore()}
				r := newReconciler(t, st, reconcile.Config{
					SyncInterval: 100 * time.Millisecond,
					Logger:       slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})),
				})
				defer r.Close(context.Background())
				sp := spec(t, 1, 100, reconcile.Optimistic)
				e := entry(r, "k", sp)
				e.Pending.Add(M)
				r.Keys().Get("k") // touched: the next round settles it
				time.Sleep(time.Second)
				synctest.Wait()
				if got, ok := st.get("k"); !ok || got != 99*M {
					t.Fatalf("before the refusal, k holds %d micro-tokens (%v), want %d", got, ok, 99*M)
				}

				st.refuse(tt.reply, "")
				const outage = 20 * time.Second
				for range outage / time.Second {
					e.Pending.Add(M) // a token a second, kept for later
					r.Keys().Get("k")
					time.Sleep(time.Second)
					synctest.Wait()
				}
				s := r.Stats()
				if s.Breaker == breaker.Closed || !r.Degraded() {
					t.Errorf("after %v of %q: breaker %v, Degraded %v; want it open", outage, tt.reply, s.Breaker, r.Degraded())
				}
				if s.Cause != tt.cause || s.Nodes[0].Cause != tt.cause {
					t.Errorf("Stats().Cause = %q, Nodes[0].Cause = %q; want %q", s.Cause, s.Nodes[0].Cause, tt.cause)
				}
				calls := st.calls()
				if most := 3 + int(outage/time.Second) + 1; calls > most {
					t.Errorf("%d calls refused in %v, want at most %d: three to open the breaker, then a probe a second", calls, outage, most)
				}
				if s.Refusals[tt.cause] < uint64(calls) {
					t.Errorf("Stats().Refusals = %v, want at least the %d refused calls counted as %q", s.Refusals, calls, tt.cause)
				}
				if got := out.count("level=WARN msg=\"hybrid: Redis refuses every call"); got != 1 || out.count(tt.text) != 1 || out.count("Redis unreachable") != 0 {
					t.Errorf("the log has %d warnings of refused calls (want 1, with %s, and none of Redis unreachable):\n%s", got, tt.text, out.buf.String())
				}

				st.refuse(nil, "")
				time.Sleep(3 * time.Second)
				synctest.Wait()
				s = r.Stats()
				if s.Breaker != breaker.Closed || s.Cause != global.NoCause || s.Nodes[0].Cause != global.NoCause {
					t.Errorf("once Redis takes writes: breaker %v, cause %q; want closed, none", s.Breaker, s.Cause)
				}
				if got, _ := st.get("k"); got != int64(99-outage/time.Second)*M {
					t.Errorf("once Redis takes writes, k holds %d micro-tokens, want %d: the outage's consumption charged", got, int64(99-outage/time.Second)*M)
				}
				if got := out.count("Redis reachable again"); got != 1 {
					t.Errorf("%d lines of Redis back, want 1:\n%s", got, out.buf.String())
				}
			})
		})
	}
}

// TestRefusedKeyAnswered: a call that carries one settlement refused (OOM)
// and another applied fails for the breaker, but the applied one's caller
// gets its reply, not the call's error: it was applied, and must not be
// taken for one that was not (its give-back would be made again).
func TestRefusedKeyAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &refusing{store: newStore()}
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Breaker: neverOpens})
		defer r.Close(context.Background())
		m, _ := global.Limit{Rate: 1, Burst: 10}.Micro()
		st.refuse(redisReply("OOM command not allowed when used memory > 'maxmemory'."), "refused")
		st.set(func(s *store) { s.gate = make(chan struct{}) }) // the two go in one call
		var wg sync.WaitGroup
		var reps [2]global.Reply
		var errs [2]error
		for i, key := range []string{"applied", "refused"} {
			wg.Go(func() {
				reps[i], errs[i] = r.SettleNow(context.Background(), global.Settlement{Key: key, Limit: m, Want: M})
			})
		}
		synctest.Wait()
		st.store.mu.Lock()
		close(st.store.gate)
		st.store.mu.Unlock()
		wg.Wait()
		if errs[0] != nil || reps[0].Err != nil || reps[0].Granted != M {
			t.Errorf("SettleNow(applied) = %+v, %v; want its grant of %d, no error", reps[0], errs[0], M)
		}
		if err := errs[1]; err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Errorf("SettleNow(refused) = %+v, %v; want the OOM reply", reps[1], err)
		}
	})
}
