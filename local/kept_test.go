package local

import (
	"testing"
	"time"
)

// TestTakeKept checks what TakeKept reports of a bucket seeded by TakeFrom
// (burst 250, 250 a second): the refill its takes made room for, which a
// bucket nobody took from would have lost at its burst.
func TestTakeKept(t *testing.T) {
	const M = Micro
	lim := Limit{Rate: 250 * M, Burst: 250 * M}
	s := time.Second
	take := func(e *Entry[struct{}], at time.Duration, n int64) {
		t.Helper()
		if !e.TakeFrom(at, lim, n*M, 0, 0) {
			t.Fatalf("TakeFrom(%v, %d tokens) refused", at, n)
		}
	}

	// Spent as it refills for 10 s from empty: 2500 taken, of which the
	// 2250 beyond the burst an untaken bucket would have lost.
	e := newEntry[struct{}]("k", 0)
	take(e, 0, 0)
	for i := range 100 {
		take(e, time.Duration(i+1)*s/10, 25)
	}
	since, kept, ok := e.TakeKept()
	if !ok || since != 1 || kept != 2250*M {
		t.Errorf("spent as it refills: TakeKept = %v, %d, %v; want 1ns, 2250 tokens, true", since, kept/M, ok)
	}
	if _, _, ok := e.TakeKept(); ok {
		t.Errorf("TakeKept again, nothing taken since: ok")
	}

	// Idle until full, then emptied from 9 s on: of 450 taken, the 200
	// refilled while it was spent.
	e = newEntry[struct{}]("k", 0)
	take(e, 0, 0)
	for i := range 9 {
		take(e, 9*s+time.Duration(i)*s/10, 50)
	}
	if _, kept, _ := e.TakeKept(); kept != 200*M {
		t.Errorf("idle, then emptied: kept %d tokens, want 200", kept/M)
	}

	// Full at 1 s, taken from, a take undone, and left to fill again: the
	// 50 taken made room for as much of the refill, which a full bucket
	// would have lost.
	e = newEntry[struct{}]("k", 0)
	take(e, 0, 0)
	take(e, s, 100)
	take(e, s, 50)
	e.PutAt(s, lim, 100*M)
	take(e, 2*s, 0)
	if _, kept, ok := e.TakeKept(); !ok || kept != 50*M {
		t.Errorf("a take undone: TakeKept = %d, %v; want 50 tokens, true", kept/M, ok)
	}

	// A report that could not be used is reported again with the next
	// (250 kept of 500 taken in 2 s); one of another seed is not.
	e = newEntry[struct{}]("k", 0)
	take(e, 0, 0)
	for i := range 20 {
		take(e, time.Duration(i+1)*s/10, 25)
	}
	since, kept, _ = e.TakeKept() // 500 taken, 250 kept
	e.PutKept(since, kept)
	e.PutKept(since+1, kept)
	take(e, 2*s+s/10, 25) // refilled while an untaken bucket was full: kept too
	if _, again, ok := e.TakeKept(); !ok || again != kept+25*M {
		t.Errorf("after PutKept: kept %d tokens, %v; want %d", again/M, ok, kept/M+25)
	}

	// A bucket set, not seeded, reports nothing.
	e = newEntry[struct{}]("k", 0)
	e.SetBucket(Full(lim, 0))
	if !e.TakeAt(s, lim, M) {
		t.Fatal("TakeAt refused")
	}
	if _, _, ok := e.TakeKept(); ok {
		t.Errorf("a bucket never seeded: TakeKept ok")
	}
}

// TestTakeFromAnew: a bucket started by TakeFrom in an earlier outage
// starts anew from its seed at the next one, however lately it was used:
// one used until the last moments of the first outage (the fallback
// decides a few rounds after the breakers close) goes on no more, with
// what it refilled in between, into a second that begins a moment later.
// A bucket started since after goes on.
func TestTakeFromAnew(t *testing.T) {
	const M = Micro
	lim := Limit{Rate: 10 * M, Burst: 10 * M} // 10 a second
	e := newEntry[struct{}]("k", 0)
	s := time.Second
	if !e.TakeFrom(1*s, lim, 2*M, 0, 2*M) { // the first outage: seeded with 2
		t.Fatal("the first outage's take refused")
	}
	for at := 1100 * time.Millisecond; at <= 2*s; at += 100 * time.Millisecond {
		e.TakeFrom(at, lim, M, 0, 0) // spent as it refills, until 2 s
	}
	// The second outage's decisions belong to it from 1.5 s on (after):
	// the bucket was used since, but started before.
	after := 1500 * time.Millisecond
	if e.Started(after) {
		t.Fatalf("Started(%v) of a bucket started at 1 s: true, want false", after)
	}
	// A second later it would hold 10: it holds the seed, 1, less the take.
	if !e.TakeFrom(3*s, lim, M, after, M) {
		t.Fatal("the second outage's first take refused, from a seed of 1")
	}
	if e.TakeFrom(3*s, lim, M, after, 10*M) {
		t.Fatal("the second outage's second take, at once: admitted, want the bucket started anew from 1 and empty")
	}
	if !e.Started(after) || !e.Started(3*s) {
		t.Errorf("Started(%v), Started(3s) of the bucket started at 3 s: %v, %v, want true, true", after, e.Started(after), e.Started(3*s))
	}
	if e.Started(3*s + 1) {
		t.Errorf("Started(3s+1ns) of the bucket started at 3 s: true, want false")
	}
}
