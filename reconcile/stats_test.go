package reconcile_test

import (
	"bytes"
	"context"
	"errors"
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

// clockStore is a store whose round trips take rtt, half before Redis reads
// its clock and half after, and whose clock is offset from this host's.
type clockStore struct {
	*store
	rtt, offset time.Duration
}

func (s *clockStore) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	time.Sleep(s.rtt / 2)
	now := time.Now().Add(s.offset)
	err := s.store.Settle(ctx, batch, replies)
	for i := range replies[:len(batch)] {
		if replies[i].Err == nil {
			replies[i].Now = now
		}
	}
	time.Sleep(s.rtt - s.rtt/2)
	return err
}

func (s *clockStore) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, time.Time, error) {
	time.Sleep(s.rtt / 2)
	live, _, err := s.store.Heartbeat(ctx, id, ttl)
	now := time.Now().Add(s.offset)
	time.Sleep(s.rtt - s.rtt/2)
	return live, now, err
}

// TestStatsClock: the round-trip time and Redis's clock skew are measured on
// the heartbeats and on the rounds' settlement calls, and the calls' durations
// fill the histogram's bucket of their duration.
func TestStatsClock(t *testing.T) {
	tests := []struct {
		rtt, offset time.Duration
		bucket      int // the histogram's bucket of rtt
	}{
		{0, 0, 0},
		{20 * time.Millisecond, 1500 * time.Millisecond, 6},   // (10ms, 25ms]
		{4 * time.Millisecond, -250 * time.Millisecond, 4},    // (2.5ms, 5ms]
		{25 * time.Millisecond, 3 * time.Microsecond, 6},      // a bound is in its bucket
		{40 * time.Millisecond, -time.Hour, 7},                // (25ms, 50ms], under the call timeout
		{400 * time.Microsecond, 100 * time.Millisecond, 1},   // (250µs, 500µs]
		{250*time.Microsecond + 1, 10 * time.Millisecond, 1},  // just above a bound
		{2 * time.Millisecond, 24 * time.Hour, 3},             // a day ahead
		{time.Millisecond, -24 * time.Hour, 2},                // a day behind
		{30 * time.Millisecond, 7 * time.Millisecond / 3, 7},  // odd figures
		{12 * time.Millisecond, -time.Millisecond / 7, 6},     // odd figures
		{100 * time.Microsecond, 42 * time.Nanosecond, 0},     // tiny
		{48 * time.Millisecond, 0, 7},                         // slow, no skew
		{6 * time.Millisecond, 5 * time.Second, 5},            // (5ms, 10ms]
		{1700 * time.Microsecond, -900 * time.Millisecond, 3}, // (1ms, 2.5ms]
	}
	for _, tt := range tests {
		t.Run(tt.rtt.String()+"/"+tt.offset.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &clockStore{store: newStore(), rtt: tt.rtt, offset: tt.offset}
				r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
				defer r.Close(context.Background())
				// Every round trip here takes less than 50ms: wait for them.
				wait := func(d time.Duration) {
					time.Sleep(d)
					synctest.Wait()
				}
				wait(50 * time.Millisecond) // the first heartbeat
				s := r.Stats()
				if s.RTT != tt.rtt || s.Skew != tt.offset || s.ClockSamples != 1 {
					t.Errorf("after the first heartbeat: RTT %v, Skew %v, ClockSamples %d, want %v, %v, 1", s.RTT, s.Skew, s.ClockSamples, tt.rtt, tt.offset)
				}
				if s.RoundTrip.Count != 0 {
					t.Errorf("RoundTrip.Count = %d before any round, want 0", s.RoundTrip.Count)
				}
				// A young instance's first heartbeats come a round apart
				// (after the one before has answered): let them pass, each
				// a clock sample. The rounds stay 50ms into each wait.
				wait(reconcile.YoungBeats * 100 * time.Millisecond)
				beats := uint64(reconcile.YoungBeats)
				if s := r.Stats(); s.ClockSamples != beats {
					t.Errorf("after the first heartbeats: ClockSamples %d, want %d", s.ClockSamples, beats)
				}

				e := entry(r, "k", spec(t, 10, 100, reconcile.Optimistic))
				const rounds = 3
				for range rounds {
					r.Keys().Get("k") // as a decision does: the key is in the next round
					e.Pending.Add(M)
					wait(100 * time.Millisecond) // a round, 50ms in
				}
				s = r.Stats()
				if s.Rounds != rounds || s.RoundTrip.Count != rounds {
					t.Fatalf("Rounds %d, RoundTrip.Count %d, want %d each", s.Rounds, s.RoundTrip.Count, rounds)
				}
				if s.RTT != tt.rtt || s.Skew != tt.offset || s.ClockSamples != beats+rounds {
					t.Errorf("after %d rounds: RTT %v, Skew %v, ClockSamples %d, want %v, %v, %d", rounds, s.RTT, s.Skew, s.ClockSamples, tt.rtt, tt.offset, beats+rounds)
				}
				var want [len(s.RoundTrip.Counts)]uint64
				want[tt.bucket] = rounds
				if s.RoundTrip.Counts != want {
					t.Errorf("RoundTrip.Counts = %v, want %v (bounds %v)", s.RoundTrip.Counts, want, s.RoundTrip.Bounds())
				}
				if s.RoundTrip.Sum != rounds*tt.rtt || s.RoundTrip.Max != tt.rtt || s.LastRound != tt.rtt {
					t.Errorf("RoundTrip.Sum %v, Max %v, LastRound %v, want %v, %v, %v", s.RoundTrip.Sum, s.RoundTrip.Max, s.LastRound, rounds*tt.rtt, tt.rtt, tt.rtt)
				}
			})
		})
	}
}

// TestStatsLocalAllowed: the spends counted in entries' allowances are
// summed at the next round for the keys it visits, and when a key leaves the
// store; spends of fetched tokens are not counted.
func TestStatsLocalAllowed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		sp := spec(t, 10, 100, reconcile.Optimistic)
		a, b := entry(r, "a", sp), entry(r, "b", sp)
		spend := func(e *reconcile.Entry, n int) {
			r.Keys().Get(e.Key())           // a decision looks its key up: that lists it for the round
			e.Allowance.Add(int64(n+1) * M) // rounds resize the budget: make room
			for range n {
				if !e.Allowance.Spend(M) {
					t.Fatalf("Spend on %s failed", e.Key())
				}
			}
		}
		steps := []struct {
			name string
			do   func()
			want uint64 // LocalAllowed after the step and a round
		}{
			{"3 on a, 2 on b", func() { spend(a, 3); spend(b, 2) }, 5},
			{"nothing", func() {}, 5},
			{"1 on a, 1 fetched", func() {
				spend(a, 1)
				if _, ok := a.Allowance.SpendUncounted(M); !ok {
					t.Fatal("SpendUncounted failed")
				}
			}, 6},
			{"3000 on a: carried past 1024", func() { spend(a, 3000) }, 3006},
			{"1500 on b, then b leaves", func() {
				spend(b, 1500)
				r.Keys().Remove("b")
			}, 4506},
		}
		for _, s := range steps {
			s.do()
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			if got := r.Stats().LocalAllowed; got != s.want {
				t.Errorf("%s: LocalAllowed = %d, want %d", s.name, got, s.want)
			}
		}
		spend(a, 7)
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := r.Stats().LocalAllowed; got != 4513 {
			t.Errorf("after Close: LocalAllowed = %d, want 4513", got)
		}
	})
}

// TestStatsUnsettled: consumption that rounds cannot charge is reported as
// unsettled, with what keys that left the store owe, until a round charges
// it; keys that leave with dues are counted.
func TestStatsUnsettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		lease := spec(t, 10, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		entry(r, "idle", lease) // leaves with nothing to settle
		round := func() {
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}
		st.set(func(s *store) { s.fail = errors.New("connection refused") })
		e.Pending.Add(4 * M)
		round()
		if got := r.Stats().Unsettled; got != 4*M {
			t.Errorf("after a failed round: Unsettled = %d, want %d", got, 4*M)
		}
		e.Pending.Add(M)
		round()
		if got := r.Stats().Unsettled; got != 5*M {
			t.Errorf("after two failed rounds: Unsettled = %d, want %d", got, 5*M)
		}
		r.Keys().Remove("k") // its 5 tokens become an orphan's
		r.Keys().Remove("idle")
		s := r.Stats()
		if s.Unsettled != 5*M || s.Orphans != 1 || s.EvictedPending != 1 || s.Evicted != 2 {
			t.Errorf("after the keys left: Unsettled %d, Orphans %d, EvictedPending %d, Evicted %d, want %d, 1, 1, 2", s.Unsettled, s.Orphans, s.EvictedPending, s.Evicted, 5*M)
		}
		o := entry(r, "o", sp)
		o.Pending.Add(2 * M)
		round() // the orphan's round fails too; o is put back in its entry
		if got := r.Stats().Unsettled; got != 7*M {
			t.Errorf("after a third failed round: Unsettled = %d, want %d", got, 7*M)
		}
		st.set(func(s *store) { s.fail = nil })
		time.Sleep(2 * time.Second) // the breaker closes again
		synctest.Wait()
		s = r.Stats()
		if s.Unsettled != 0 || s.Orphans != 0 {
			t.Errorf("after Redis is back: Unsettled %d, Orphans %d, want 0, 0", s.Unsettled, s.Orphans)
		}
		if got, _ := st.get("k"); got != 95*M {
			t.Errorf("Redis holds %d for k, want %d", got, 95*M)
		}
	})
}

// logBuffer is an io.Writer safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns the lines that contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for line := range strings.Lines(b.buf.String()) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestStatsLog: an outage of 35s with a round every 100ms logs the opening
// breaker once, the failing rounds four times (the first, then every 10s),
// the recovery of the rounds and of the breaker once each, and Close; the
// breaker's transitions are counted by state.
func TestStatsLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out logBuffer
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{
			SyncInterval: 100 * time.Millisecond,
			Logger:       slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})),
		})
		e := entry(r, "k", spec(t, 10, 100, reconcile.Optimistic))
		e.Pending.Add(M) // kept until Redis is back: every round has it to settle
		st.set(func(s *store) { s.fail = errors.New("connection refused") })
		time.Sleep(35 * time.Second)
		synctest.Wait()
		st.set(func(s *store) { s.fail = nil })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		e.Pending.Add(M) // for Close to settle
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		s := r.Stats()
		if s.RoundErrors < 300 {
			t.Fatalf("%d failed rounds, want at least 300", s.RoundErrors)
		}
		tests := []struct {
			msg  string
			want int
		}{
			{"level=WARN msg=\"hybrid: Redis unreachable", 1},
			{"level=WARN msg=\"hybrid: settlement round failed", 1},
			{"level=WARN msg=\"hybrid: settlement rounds still failing\" failed_rounds=", 3},
			{"level=INFO msg=\"hybrid: settlement rounds succeed again\"", 1},
			{"level=INFO msg=\"hybrid: Redis reachable again", 1},
			{"level=INFO msg=\"hybrid: closed\" keys_settled=1", 1},
			{"breaker state changed", 0}, // the probes log at debug level
		}
		for _, tt := range tests {
			if got := out.count(tt.msg); got != tt.want {
				t.Errorf("%d lines with %q, want %d; the log:\n%s", got, tt.msg, tt.want, out.buf.String())
			}
		}
		if got := strings.Count(out.buf.String(), "\n"); got != 8 {
			t.Errorf("%d log lines, want 8:\n%s", got, out.buf.String())
		}

		c, h, o := breaker.Closed, breaker.HalfOpen, breaker.Open
		bt := s.BreakerTransitions
		if bt[c][o] != 1 || bt[h][c] != 1 || bt[o][h] != bt[h][o]+1 || bt[o][h] < 30 || bt[c][h] != 0 || bt[o][c] != 0 {
			t.Errorf("BreakerTransitions = %v, want 1 closed->open, 1 half-open->closed, about one probe a second", bt)
		}
		sum := uint64(0)
		for _, row := range bt {
			for _, n := range row {
				sum += n
			}
		}
		if sum != s.Transitions || s.Breaker != c {
			t.Errorf("transitions %d by state, %d in all, breaker %v; want equal, closed", sum, s.Transitions, s.Breaker)
		}
	})
}

// TestStatsLive: Live is what the heartbeats count, also when
// Config.Instances fixes the fleet size of the fallback shares.
func TestStatsLive(t *testing.T) {
	for _, fixed := range []int{0, 5} {
		synctest.Test(t, func(t *testing.T) {
			st := newStore()
			st.live = 3
			r := newReconciler(t, st, reconcile.Config{Instances: fixed})
			defer r.Close(context.Background())
			synctest.Wait()
			want := int64(3)
			if fixed > 0 {
				want = int64(fixed)
			}
			if s := r.Stats(); s.Live != 3 || s.Instances != want {
				t.Errorf("Instances %d: Stats Live %d, Instances %d, want 3, %d", fixed, s.Live, s.Instances, want)
			}
		})
	}
}

// TestStatsInFlight: while a round is under way, the settlements it holds,
// orphans it took included, are InFlight rather than nowhere; none once it
// is answered.
func TestStatsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		for _, k := range []string{"a", "b", "c"} {
			e := entry(r, k, sp)
			r.Keys().Get(k)
			e.Pending.Add(M)
		}
		r.Keys().Remove("c") // an orphan now
		gate := make(chan struct{})
		st.set(func(s *store) { s.gate = gate })
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the round waits at the gate
		if s := r.Stats(); s.InFlight != 3 || s.Orphans != 0 {
			t.Errorf("during the round: InFlight %d, Orphans %d, want 3, 0", s.InFlight, s.Orphans)
		}
		close(gate)
		synctest.Wait()
		if s := r.Stats(); s.InFlight != 0 || s.Unsettled != 0 {
			t.Errorf("after the round: InFlight %d, Unsettled %d, want 0, 0", s.InFlight, s.Unsettled)
		}
	})
}
