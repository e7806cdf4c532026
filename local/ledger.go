package local

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Ledger remembers, in bounded memory, when the token buckets of keys that
// left a Store are full again, so that a key made again starts where it was
// rather than full: a fallback's share for a key whose entry was evicted
// and made again during an outage, say, which would otherwise grant its
// share anew at every eviction.
//
// A key's record is one time, the moment its bucket is full again (a
// bucket of limit L holding t micro-tokens at now is full at now plus the
// time L refills L.Burst - t). A later time means fewer tokens for any
// limit, so records merge by taking the later time, and a time that errs
// late errs towards denying.
//
// The ledger is a table of sets of ledgerWays records; a record holds a
// 24-bit fingerprint of its key and its time in milliseconds, rounded up.
// A set that is full drops the record whose bucket is full soonest, and
// keeps the latest time it dropped as its floor: a key not found in its set
// (never put, or dropped) reads as full at the floor, never sooner. So the
// ledger never tells a key it holds more than it did; where it cannot tell
// (the set dropped records still in the future), it tells less. Keys whose
// fingerprints collide in a set share one record, the later time. A record
// whose time has passed is free.
//
// The table is made at the first Put: a ledger never written costs nothing.
// The zero Ledger is not usable; make one with NewLedger. It is safe for
// concurrent use.
type Ledger struct {
	once  sync.Once
	made  atomic.Bool // the table is made: reads may look
	seed  maphash.Seed
	sets  int
	recs  []atomic.Uint64
	floor []atomic.Int64 // ms, per set
	locks []ledgerLock   // set i's writers take locks[i%len(locks)]

	put, dropped, unknown atomic.Uint64
}

// ledgerLock is one of the locks that serialise the writers of a set,
// padded to its own cache line.
type ledgerLock struct {
	sync.Mutex
	_ [64 - unsafe.Sizeof(sync.Mutex{})]byte
}

// The shape of a Ledger.
const (
	ledgerWays  = 8 // records a set: one cache line
	ledgerLocks = 256
	fpBits      = 24
	atBits      = 64 - fpBits // milliseconds since the clock's epoch: 34 years
	atMask      = 1<<atBits - 1
)

// LedgerStats is a snapshot of a Ledger.
type LedgerStats struct {
	// Capacity is the records the ledger holds at most; Bytes the memory
	// its table and locks take (0 until the first Put makes them).
	Capacity int
	Bytes    int64
	// Keys is the records held whose bucket is not full yet (Stats counts
	// them: a pass over the table).
	Keys int
	// Put counts the records written; Dropped those dropped from a full
	// set, whose time raised the set's floor; Unknown the reads of a key
	// not found in a set whose floor was still in the future: a key the
	// ledger could not tell apart from one it dropped, told it holds no
	// more than the floor allows.
	Put, Dropped, Unknown uint64
}

// NewLedger returns a ledger of capacity records (rounded up to whole sets,
// at least one), made at its first Put.
func NewLedger(capacity int) *Ledger {
	return &Ledger{sets: max((capacity+ledgerWays-1)/ledgerWays, 1)}
}

// make allocates the table.
func (l *Ledger) make() {
	l.once.Do(func() {
		l.seed = maphash.MakeSeed()
		l.recs = make([]atomic.Uint64, l.sets*ledgerWays)
		l.floor = make([]atomic.Int64, l.sets)
		l.locks = make([]ledgerLock, min(l.sets, ledgerLocks))
		l.made.Store(true)
	})
}

// slot returns the set of key and its fingerprint (never 0).
func (l *Ledger) slot(key string) (set int, fp uint64) {
	h := maphash.String(l.seed, key)
	fp = h >> atBits
	if fp == 0 {
		fp = 1
	}
	return int(uint64(uint32(h)) * uint64(l.sets) >> 32), fp // the low half, scaled to the sets
}

// ms returns d in whole milliseconds, rounded up, at least 1 (0 marks a
// free record).
func ms(d time.Duration) int64 {
	return max((int64(d)+int64(time.Millisecond)-1)/int64(time.Millisecond), 1)
}

// Put records that key's bucket is full at full, read at now: a later time
// than the one recorded replaces it, an earlier one changes nothing. A full
// time not after now needs no record.
func (l *Ledger) Put(key string, full, now time.Duration) {
	if full <= now {
		return
	}
	l.make()
	set, fp := l.slot(key)
	at, nowMs := min(ms(full), atMask), ms(now)
	mu := &l.locks[set%len(l.locks)]
	mu.Lock()
	defer mu.Unlock()
	recs := l.recs[set*ledgerWays : (set+1)*ledgerWays]
	free, soonest := -1, -1
	var soonestAt int64
	for i := range recs {
		r := recs[i].Load()
		rfp, rat := r>>atBits, int64(r&atMask)
		switch {
		case r != 0 && rfp == fp:
			if at > rat {
				recs[i].Store(fp<<atBits | uint64(at))
			}
			return
		case r == 0 || rat <= nowMs:
			if free < 0 {
				free = i
			}
		case soonest < 0 || rat < soonestAt:
			soonest, soonestAt = i, rat
		}
	}
	l.put.Add(1)
	if free < 0 { // drop the record that is full soonest: the floor keeps it
		free = soonest
		if f := &l.floor[set]; soonestAt > f.Load() {
			f.Store(soonestAt)
		}
		l.dropped.Add(1)
	}
	recs[free].Store(fp<<atBits | uint64(at))
}

// Empty reports whether nothing was ever put in l: Full then tells every
// key full, and a caller may skip reading its clock.
func (l *Ledger) Empty() bool { return !l.made.Load() }

// Full returns when key's bucket is full, as far as the ledger can tell at
// now: its record's time, or, for a key it holds no record of, the floor of
// its set (the latest time the set dropped). A time not after now means
// full. found reports whether the key had a record. A key's record stands
// for it alone only if every record put for it started from what Full told
// of it before: then a record dropped and put again starts from the floor.
func (l *Ledger) Full(key string, now time.Duration) (full time.Duration, found bool) {
	if !l.made.Load() {
		return 0, false
	}
	set, fp := l.slot(key)
	nowMs := ms(now)
	for i := range ledgerWays {
		r := l.recs[set*ledgerWays+i].Load()
		if r != 0 && r>>atBits == fp {
			// The key's own record: each put of it was seeded from what
			// the ledger told before (the floor, had it been dropped).
			if at := int64(r & atMask); at > nowMs {
				return time.Duration(at) * time.Millisecond, true
			}
			return 0, true
		}
	}
	if f := l.floor[set].Load(); f > nowMs {
		l.unknown.Add(1)
		return time.Duration(f) * time.Millisecond, false
	}
	return 0, false
}

// Stats returns a snapshot of l's counts at now.
func (l *Ledger) Stats(now time.Duration) LedgerStats {
	s := LedgerStats{
		Capacity: l.sets * ledgerWays,
		Put:      l.put.Load(),
		Dropped:  l.dropped.Load(),
		Unknown:  l.unknown.Load(),
	}
	if !l.made.Load() {
		return s
	}
	s.Bytes = int64(len(l.recs))*8 + int64(len(l.floor))*8 + int64(len(l.locks))*int64(unsafe.Sizeof(ledgerLock{}))
	nowMs := ms(now)
	for i := range l.recs {
		if r := l.recs[i].Load(); r != 0 && int64(r&atMask) > nowMs {
			s.Keys++
		}
	}
	return s
}
