package local

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTokens(t *testing.T) {
	var a Tokens
	if a.Spend(1) {
		t.Fatal("Spend on a zero Tokens succeeded")
	}
	if !a.Add(10) || a.Load() != 10 {
		t.Fatalf("after Add(10): Load = %d, want 10", a.Load())
	}
	if !a.Spend(4) || a.Spend(7) || a.Load() != 6 {
		t.Fatalf("Spend(4) then Spend(7): Load = %d, want 6 and the second refused", a.Load())
	}
	if got := a.TakeAll(); got != 6 || a.Load() != 0 {
		t.Fatalf("TakeAll = %d (Load after %d), want 6 (0)", got, a.Load())
	}
	a.Add(3)
	if got := a.Retire(); got != 3 {
		t.Fatalf("Retire = %d, want 3", got)
	}
	if !a.Retired() || a.Add(5) || a.Spend(1) || a.TakeAll() != 0 || a.Load() != 0 || a.Retire() != 0 {
		t.Fatal("a retired Tokens accepted, spent or returned something")
	}
}

// TestTokensConservation spends, adds and retires concurrently: every
// micro-token added is either spent or handed back by TakeAll/Retire, and an
// Add refused after retirement keeps its tokens with the caller.
func TestTokensConservation(t *testing.T) {
	for range 50 {
		var a Tokens
		var spent, added, back atomic.Int64
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 2000 {
					switch {
					case g == 0 && i%3 == 0:
						if a.Add(5) {
							added.Add(5)
						}
					case g == 1 && i%50 == 0:
						back.Add(a.TakeAll())
					default:
						if a.Spend(2) {
							spent.Add(2)
						}
					}
				}
			})
		}
		wg.Go(func() { back.Add(a.Retire()) })
		wg.Wait()
		back.Add(a.Retire())
		if spent.Load()+back.Load() != added.Load() {
			t.Fatalf("spent %d + handed back %d != added %d", spent.Load(), back.Load(), added.Load())
		}
	}
}

type evicted struct {
	key             string
	unused, pending int64
}

func newTestStore(t *testing.T, cfg Config[none]) (*Store[none], *[]evicted) {
	t.Helper()
	var mu sync.Mutex
	var out []evicted
	cfg.OnEvict = func(e *Entry[none], unused, pending int64) {
		if !e.Retired() {
			t.Errorf("OnEvict(%q): entry not retired", e.Key())
		}
		mu.Lock()
		out = append(out, evicted{e.Key(), unused, pending})
		mu.Unlock()
	}
	s, err := New[none](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, &out
}

// TestStoreGetOrAdd: GetOrAdd adds a key once, with a copy of its own, and
// Get and Add find it after.
func TestStoreGetOrAdd(t *testing.T) {
	s, _ := newTestStore(t, Config[none]{})
	if e := s.Get("a"); e != nil {
		t.Fatalf("Get on an empty store = %v", e)
	}
	buf := []byte("a")
	a, added := s.GetOrAdd(string(buf))
	if !added || a.Key() != "a" {
		t.Fatalf("GetOrAdd(a) = %q, %v; want a new entry", a.Key(), added)
	}
	buf[0] = 'z' // the store keeps its own copy of the key
	if again, added := s.GetOrAdd("a"); added || again != a {
		t.Fatalf("second GetOrAdd(a) added a new entry")
	}
	if got := s.Get("a"); got != a {
		t.Fatalf("Get(a) = %p, want %p", got, a)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d, want 1", s.Len())
	}
	// Add, for a key a Get missed, finds a key added meanwhile.
	if again, added := s.Add("a"); added || again != a {
		t.Fatalf("Add(a) of a tracked key = %p, added %v; want %p", again, added, a)
	}
	if b, added := s.Add("b"); !added || b.Key() != "b" || s.Get("b") != b || s.Len() != 2 {
		t.Fatalf("Add(b) = %q, added %v, Len %d; want a new entry, 2", b.Key(), added, s.Len())
	}
}

// TestStoreEvictionHandOff fills one shard past its capacity and checks that
// the least recently used entry leaves, retired, with its unspent allowance
// and pending consumption handed to OnEvict.
func TestStoreEvictionHandOff(t *testing.T) {
	s, out := newTestStore(t, Config[none]{Capacity: 3, Shards: 1})
	for i, k := range []string{"a", "b", "c"} {
		e, _ := s.GetOrAdd(k)
		e.Allowance.Add(int64(10 * (i + 1)))
		e.Pending.Add(int64(i + 1))
	}
	s.Tick(nil)
	s.Get("a") // a is now more recent than b and c
	b := s.Get("b")
	b.Allowance.Spend(5)
	s.GetOrAdd("d") // evicts c: b was touched by the Get above
	s.GetOrAdd("e") // evicts a, touched before b
	want := []evicted{{"c", 30, 3}, {"a", 10, 1}}
	if len(*out) != len(want) {
		t.Fatalf("evicted %v, want %v", *out, want)
	}
	for i := range want {
		if (*out)[i] != want[i] {
			t.Errorf("eviction %d = %+v, want %+v", i, (*out)[i], want[i])
		}
	}
	if s.Get("c") != nil || s.Get("a") != nil {
		t.Error("an evicted key is still found")
	}
	if b.Retired() {
		t.Fatal("b was retired, but it was the most recently used")
	}
	if !s.Remove("b") || s.Remove("b") {
		t.Fatal("Remove(b) twice: want true then false")
	}
	if got := (*out)[2]; got.key != "b" || got.unused != 15 || got.pending != 2 {
		t.Errorf("Remove handed off %+v, want {b 15 2}", got)
	}
	if n := s.Drain(); n != 2 || s.Len() != 0 {
		t.Errorf("Drain = %d (Len after %d), want 2 (0)", n, s.Len())
	}
}

// TestStoreConservation churns many goroutines through more keys than the
// store holds, granting and spending allowance and recording pending
// consumption, while entries are evicted under them. Afterwards every
// micro-token granted is spent or handed back, and every pending one is
// handed back: nothing vanishes with an evicted entry.
func TestStoreConservation(t *testing.T) {
	var handedUnused, handedPending atomic.Int64
	s, err := New[none](Config[none]{Capacity: 64, Shards: 4, OnEvict: func(e *Entry[none], unused, pending int64) {
		handedUnused.Add(unused)
		handedPending.Add(pending)
	}})
	if err != nil {
		t.Fatal(err)
	}
	var granted, refused, spent, pending atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 5000 {
				key := fmt.Sprintf("k%d", rng.IntN(300))
				e, _ := s.GetOrAdd(key)
				switch rng.IntN(4) {
				case 0:
					if e.Allowance.Add(10) {
						granted.Add(10)
					} else {
						refused.Add(10)
					}
				case 1:
					if e.Pending.Add(1) {
						pending.Add(1)
					}
				case 2:
					s.Tick(nil)
				default:
					if e.Allowance.Spend(3) {
						spent.Add(3)
					}
				}
			}
		})
	}
	wg.Wait()
	s.Drain()
	if spent.Load()+handedUnused.Load() != granted.Load() {
		t.Errorf("spent %d + handed back %d != granted %d", spent.Load(), handedUnused.Load(), granted.Load())
	}
	if handedPending.Load() != pending.Load() {
		t.Errorf("pending handed back %d != recorded %d", handedPending.Load(), pending.Load())
	}
	if refused.Load() == 0 {
		t.Log("no grant met a retired entry this run")
	}
}

// TestStoreTableChurn adds and removes far more keys than fit, checking after
// every step that exactly the live keys are found.
func TestStoreTableChurn(t *testing.T) {
	s, _ := newTestStore(t, Config[none]{Capacity: 1 << 20, Shards: 2})
	live := map[string]bool{}
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range 20000 {
		k := fmt.Sprintf("key-%d", rng.IntN(2000))
		if rng.IntN(3) == 0 {
			if got := s.Remove(k); got != live[k] {
				t.Fatalf("step %d: Remove(%s) = %v, want %v", i, k, got, live[k])
			}
			delete(live, k)
		} else {
			_, added := s.GetOrAdd(k)
			if added == live[k] {
				t.Fatalf("step %d: GetOrAdd(%s) added = %v, but live = %v", i, k, added, live[k])
			}
			live[k] = true
		}
	}
	for i := range 2000 {
		k := fmt.Sprintf("key-%d", i)
		if got := s.Get(k) != nil; got != live[k] {
			t.Fatalf("Get(%s) found = %v, want %v", k, got, live[k])
		}
	}
	if s.Len() != len(live) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(live))
	}
}

func TestStoreConcurrentAddOneEntry(t *testing.T) {
	s, _ := newTestStore(t, Config[none]{})
	var wg sync.WaitGroup
	entries := make([]*Entry[none], 16)
	for i := range entries {
		wg.Go(func() { entries[i], _ = s.GetOrAdd("hot") })
	}
	wg.Wait()
	for i, e := range entries {
		if e != entries[0] {
			t.Fatalf("goroutine %d got a different entry for the same key", i)
		}
	}
}

func TestStoreConfig(t *testing.T) {
	for _, cfg := range []Config[none]{{Capacity: -1}, {Shards: 3}, {Shards: -4}, {Shards: 1 << 17}} {
		if _, err := New[none](cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) error = %v, want ErrConfig", cfg, err)
		}
	}
}

func TestEntryViewAndBucket(t *testing.T) {
	s, _ := newTestStore(t, Config[none]{})
	e, _ := s.GetOrAdd("k")
	if v := e.View(); v != (View{}) {
		t.Fatalf("View of a new entry = %+v, want zero", v)
	}
	e.SetView(View{Tokens: -5, Seen: 7})
	if v := e.View(); v.Tokens != -5 || v.Seen != 7 || v.Age(10) != 3 {
		t.Fatalf("View = %+v (age %v), want {-5 7} aged 3", v, v.Age(10))
	}
	lim := mustLimit(t, 1, 2)
	if !e.TakeAt(0, lim, 2*Micro) || e.TakeAt(0, lim, Micro) {
		t.Fatal("a new entry's bucket does not start full at burst 2")
	}
	e.SetBucket(Bucket{})
	if e.TakeAt(0, lim, Micro) {
		t.Fatal("an entry whose bucket was set empty took a token")
	}
	if got := e.Bucket(2e9, lim).Tokens(2e9, lim); got != 2*Micro {
		t.Fatalf("bucket after 2s = %d, want %d", got, 2*Micro)
	}
}

// TestViewNotTorn reads views while two goroutines write pairs whose fields
// agree: a reader must never see fields of two different writes, nor a
// writer interleave its fields with the other's.
func TestViewNotTorn(t *testing.T) {
	var e Entry[none]
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range int64(2) {
		wg.Go(func() {
			for i := int64(1); ; i++ {
				select {
				case <-stop:
					return
				default:
					n := 2*i + w
					e.SetView(View{Tokens: n, Seen: -time.Duration(n)})
				}
			}
		})
	}
	for i := range 100000 {
		if i%2 == 0 {
			if v, ok := e.TryView(); ok && v.Seen != -time.Duration(v.Tokens) {
				t.Fatalf("torn view from TryView %+v", v)
			}
		} else if v := e.View(); v.Seen != -time.Duration(v.Tokens) {
			t.Fatalf("torn view %+v", v)
		}
	}
	close(stop)
	wg.Wait()
}

// TestStoreCapacityAcrossShards: with more shards than capacity, a new key
// alone in its shard makes room elsewhere instead of evicting itself, and the
// store never holds more than its capacity.
func TestStoreCapacityAcrossShards(t *testing.T) {
	s, out := newTestStore(t, Config[none]{Capacity: 3, Shards: 64})
	for i := range 100 {
		k := fmt.Sprintf("k%d", i)
		e, added := s.GetOrAdd(k)
		if !added || e.Retired() {
			t.Fatalf("GetOrAdd(%s) = added %v, retired %v; want a live new entry", k, added, e.Retired())
		}
		if s.Get(k) != e {
			t.Fatalf("the entry just added for %s is not found", k)
		}
		if s.Len() > 3 {
			t.Fatalf("after %d adds the store holds %d, capacity 3", i+1, s.Len())
		}
	}
	if len(*out) != 97 {
		t.Fatalf("evicted %d, want 97", len(*out))
	}
}

// none is the owner state of the entries in these tests.
type none = struct{}

// TestStoreTouched: Tick lists each entry touched since the previous Tick
// once, new ones included, and nothing when nothing was touched.
func TestStoreTouched(t *testing.T) {
	s, _ := newTestStore(t, Config[none]{TrackTouched: true, Capacity: 10, Shards: 2})
	keys := func(es []*Entry[none]) map[string]int {
		m := map[string]int{}
		for _, e := range es {
			m[e.Key()]++
		}
		return m
	}
	s.GetOrAdd("a")
	s.GetOrAdd("b")
	s.Get("a")
	if got := keys(s.Tick(nil)); len(got) != 2 || got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("first Tick listed %v, want a and b once each", got)
	}
	if got := s.Tick(nil); len(got) != 0 {
		t.Fatalf("Tick with nothing touched listed %d entries", len(got))
	}
	for range 3 {
		s.Get("b")
		s.GetOrAdd("b")
	}
	s.GetOrAdd("c")
	if got := keys(s.Tick(nil)); len(got) != 2 || got["b"] != 1 || got["c"] != 1 {
		t.Fatalf("third Tick listed %v, want b and c once each", got)
	}
	// Fresh tells whether Touch would do anything: not until a new epoch.
	a := s.Get("a")
	if !s.Fresh(a) {
		t.Fatal("an entry just looked up is not Fresh")
	}
	s.Tick(nil)
	if s.Fresh(a) {
		t.Fatal("an entry not touched since Tick is Fresh")
	}
	s.Touch(a, s.Hash("a"))
	if !s.Fresh(a) {
		t.Fatal("an entry just touched is not Fresh")
	}
	if got := keys(s.Tick(nil)); len(got) != 1 || got["a"] != 1 {
		t.Fatalf("Tick after Touch listed %v, want a once", got)
	}
	untracked, _ := newTestStore(t, Config[none]{})
	untracked.GetOrAdd("a")
	if got := untracked.Tick(nil); len(got) != 0 {
		t.Fatalf("Tick without TrackTouched listed %d entries", len(got))
	}
}

// TestStoreTouchedBound: keys churning through a store whose Tick is late
// (a round held up by a slow Redis) do not pile up in the touched lists:
// evicted entries are let go, and Tick lists every entry still held.
func TestStoreTouchedBound(t *testing.T) {
	const capacity = 64
	s, _ := newTestStore(t, Config[none]{TrackTouched: true, Capacity: capacity, Shards: 1})
	for i := range 100_000 {
		s.GetOrAdd("k" + strconv.Itoa(i))
	}
	sh := &s.shards[0]
	sh.mu.Lock()
	n, c := len(sh.touched), cap(sh.touched)
	sh.mu.Unlock()
	if n > 2*capacity+1 || c > 4*capacity {
		t.Errorf("touched list: %d entries in a capacity of %d after 100000 keys churned through a store of %d, want at most %d and %d", n, c, capacity, 2*capacity+1, 4*capacity)
	}
	live := 0
	for _, e := range s.Tick(nil) {
		if !e.Retired() {
			live++
		}
	}
	if live != capacity {
		t.Errorf("Tick listed %d entries still held, want %d", live, capacity)
	}
}

func TestTokensSetAndTakeUpTo(t *testing.T) {
	var a Tokens
	a.Add(10)
	if left, ok := a.SpendLeft(4); !ok || left != 6 {
		t.Fatalf("SpendLeft(4) = %d, %v; want 6, true", left, ok)
	}
	if left, ok := a.SpendLeft(7); ok || left != 6 {
		t.Fatalf("SpendLeft(7) = %d, %v; want 6, false", left, ok)
	}
	if got := a.TakeUpTo(4); got != 4 || a.Load() != 2 {
		t.Fatalf("TakeUpTo(4) = %d (left %d), want 4 (2)", got, a.Load())
	}
	if got := a.TakeUpTo(9); got != 2 || a.Load() != 0 {
		t.Fatalf("TakeUpTo(9) = %d (left %d), want 2 (0)", got, a.Load())
	}
	if old, ok := a.Set(5); !ok || old != 0 || a.Load() != 5 {
		t.Fatalf("Set(5) = %d, %v (now %d); want 0, true (5)", old, ok, a.Load())
	}
	a.Retire()
	if _, ok := a.Set(5); ok || a.Load() != 0 || a.TakeUpTo(1) != 0 {
		t.Fatal("a retired Tokens was set or gave tokens")
	}
}
