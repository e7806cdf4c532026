package local

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestLedger(t *testing.T) {
	const s = time.Second
	l := NewLedger(64)
	if full, found := l.Full("a", 0); full != 0 || found {
		t.Fatalf("Full of an empty ledger = %v, %v, want 0, false", full, found)
	}
	if got := l.Stats(0); got.Bytes != 0 || got.Capacity != 64 {
		t.Errorf("Stats before any Put = %+v, want no bytes and a capacity of 64", got)
	}
	steps := []struct {
		op        string // "put" or "full"
		key       string
		full, now time.Duration
		want      time.Duration // for "full"
		found     bool
	}{
		{"put", "a", 10 * s, 1 * s, 0, false},
		{"full", "a", 0, 2 * s, 10 * s, true},
		{"put", "a", 5 * s, 2 * s, 0, false}, // earlier: changes nothing
		{"full", "a", 0, 3 * s, 10 * s, true},
		{"put", "a", 12 * s, 3 * s, 0, false}, // later: replaces it
		{"full", "a", 0, 3 * s, 12 * s, true},
		{"put", "b", 2 * s, 3 * s, 0, false}, // full already: no record
		{"full", "b", 0, 3 * s, 0, false},
		{"full", "a", 0, 12 * s, 0, true}, // passed: full
		{"put", "c", 1500 * time.Microsecond, 0, 0, false},
		{"full", "c", 0, time.Millisecond, 2 * time.Millisecond, true}, // rounded up to the millisecond
	}
	for i, st := range steps {
		switch st.op {
		case "put":
			l.Put(st.key, st.full, st.now)
		case "full":
			full, found := l.Full(st.key, st.now)
			if full != st.want || found != st.found {
				t.Errorf("step %d: Full(%q, %v) = %v, %v, want %v, %v", i, st.key, st.now, full, found, st.want, st.found)
			}
		}
	}
	if got := l.Stats(3 * time.Second); got.Keys != 1 || got.Bytes == 0 || got.Put != 2 {
		t.Errorf("Stats = %+v, want 1 key held, 2 records put, bytes counted", got)
	}
}

// TestLedgerFloor fills a one-set ledger past its ways: the records dropped
// are those full soonest, and a key not found reads as full no sooner than
// the latest of them, never sooner than a key it dropped.
func TestLedgerFloor(t *testing.T) {
	l := NewLedger(ledgerWays)
	now := time.Second
	n := 3 * ledgerWays
	for i := range n {
		l.Put("k"+strconv.Itoa(i), now+time.Duration(i+1)*time.Second, now)
	}
	st := l.Stats(now)
	if st.Keys != ledgerWays || st.Dropped != uint64(n-ledgerWays) {
		t.Fatalf("Stats = %+v, want %d keys held and %d dropped", st, ledgerWays, n-ledgerWays)
	}
	for i := range n {
		key := "k" + strconv.Itoa(i)
		full, _ := l.Full(key, now)
		if want := now + time.Duration(i+1)*time.Second; full < want {
			t.Errorf("Full(%q) = %v, want at least %v: the ledger told more than it was told", key, full, want)
		}
	}
	// The kept ones are the latest; a key never put reads the floor, the
	// latest time dropped.
	floor := now + time.Duration(n-ledgerWays)*time.Second
	if full, found := l.Full("never", now); full != floor || found {
		t.Errorf("Full of a key never put = %v, %v, want the floor %v, false", full, found, floor)
	}
	if got := l.Stats(now).Unknown; got == 0 {
		t.Errorf("Stats.Unknown = 0 after reads the floor answered")
	}
	// Once every record has passed, the set is free again.
	later := now + time.Duration(n+1)*time.Second
	if full, _ := l.Full("never", later); full > later {
		t.Errorf("Full after every record passed = %v, want at most %v", full, later)
	}
	l.Put("new", later+time.Second, later)
	if full, found := l.Full("new", later); full != later+time.Second || !found {
		t.Errorf("Full(new) = %v, %v, want %v, true", full, found, later+time.Second)
	}
}

// TestLedgerConcurrent has writers put growing times for shared keys while
// readers read them: a reader never sees a key's time go back.
func TestLedgerConcurrent(t *testing.T) {
	l := NewLedger(1024)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				key := "k" + strconv.Itoa(i%50)
				l.Put(key, time.Duration(1000+i+w)*time.Second, time.Second)
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			last := make(map[string]time.Duration)
			for i := range 4000 {
				key := "k" + strconv.Itoa(i%50)
				full, _ := l.Full(key, time.Second)
				if full < last[key] {
					t.Errorf("Full(%q) went back from %v to %v", key, last[key], full)
					return
				}
				last[key] = full
			}
		})
	}
	wg.Wait()
}

func TestEntryFull(t *testing.T) {
	lim := Limit{Rate: Micro, Burst: 4 * Micro} // 1 token/s, burst 4
	var e Entry[struct{}]
	if _, ok := e.Full(); ok {
		t.Fatal("Full of an entry whose bucket was never used: ok, want not")
	}
	now := time.Second
	if !e.TakeFrom(now, lim, 3*Micro, 0, 4*Micro) {
		t.Fatal("TakeFrom of 3 from a seed of 4 failed")
	}
	if full, ok := e.Full(); !ok || full != now+3*time.Second {
		t.Errorf("Full after taking 3 of 4 at 1/s = %v, %v, want %v, true", full, ok, now+3*time.Second)
	}
	e.PutAt(now, lim, Micro)
	if full, ok := e.Full(); !ok || full != now+2*time.Second {
		t.Errorf("Full after giving one back = %v, %v, want %v, true", full, ok, now+2*time.Second)
	}
	if !e.Started(now) || e.Started(now+time.Nanosecond) {
		t.Errorf("Started(%v), Started(%v) = %v, %v, want true, false", now, now+1, e.Started(now), e.Started(now+1))
	}
}

// TestStoreLedger evicts entries whose buckets were used: the store's
// ledger holds their state as they leave.
func TestStoreLedger(t *testing.T) {
	lim := Limit{Rate: Micro, Burst: 2 * Micro}
	lg := NewLedger(64)
	s, err := New(Config[struct{}]{Capacity: 1, Shards: 1, Ledger: lg})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.GetOrAdd("a")
	a.TakeFrom(time.Second, lim, 2*Micro, 0, 2*Micro) // empty: full 2 s later
	if !s.Holds(a) {
		t.Fatal("Holds(a) = false before it left")
	}
	s.GetOrAdd("b") // evicts a
	if s.Holds(a) {
		t.Fatal("Holds(a) = true after it left")
	}
	if full, found := lg.Full("a", time.Second); !found || full != 3*time.Second {
		t.Errorf("ledger's Full(a) = %v, %v, want 3s, true", full, found)
	}
	s.GetOrAdd("c") // evicts b, never used: no record
	if st := lg.Stats(time.Second); st.Put != 1 {
		t.Errorf("ledger records put = %d, want 1", st.Put)
	}
}
