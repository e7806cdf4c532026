package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// doubt is a settlement that got no reply, and so may or may not have been
// applied: it is sent again, as it was, at the next rounds, first of all,
// and nothing newer is settled for its key meanwhile (Redis takes a lower
// sequence number than the last it applied for a duplicate). A fetch in
// doubt (Instance fetchID) waits in fetchDoubts, to be sent again by the
// key's next fetch or the next round, whichever comes first; it holds no
// settlement back: the rounds' Seqs are counted apart from the fetches'.
type doubt struct {
	s global.Settlement
	o owner
}

// maxDoubt is how long a settlement is sent again before it is given up:
// Redis prunes the sequence numbers it keeps after 10 minutes, and a
// settlement applied twice gives its Returned back twice. A settlement given
// up is replaced by a new one that charges its consumption (charged twice at
// worst, which errs towards denying) and gives nothing back.
const maxDoubt = 5 * time.Minute

// takeDoubts puts the settlements in doubt, and the fetches found in doubt
// since the last round, first in r.sets, for the round to send again, and
// gives up those in doubt for longer than maxDoubt. The keys of the rounds'
// own are in r.inDoubt until the replies come (send then sets it to the
// keys still in doubt).
func (r *Reconciler) takeDoubts() {
	now := r.clock.Now()
	r.mu.Lock()
	for _, d := range r.fetchDoubts {
		r.doubts = append(r.doubts, d)
	}
	if len(r.fetchDoubts) > 4*maxBatch { // a map keeps its size once grown
		r.fetchDoubts = make(map[string]doubt)
	} else {
		clear(r.fetchDoubts)
	}
	r.nfetchDoubts.Store(0)
	r.mu.Unlock()
	n := len(r.doubts)
	r.clearInDoubt(n)
	for _, d := range r.doubts {
		if now-d.o.since > maxDoubt {
			r.stats.doubtsExpired.Add(1)
			r.restore(&d.s, d.o, true, true)
			continue
		}
		r.sets = append(r.sets, d.s)
		r.owners = append(r.owners, d.o)
		if d.s.Instance == r.dedup { // a fetch's Seqs are not the rounds'
			r.inDoubt[d.s.Key] = true
		}
	}
	r.inDoubtPeak = max(r.inDoubtPeak, len(r.inDoubt))
	r.resends = len(r.sets)
	// As trim does for the round's buffers: the doubts of one round cut
	// short after an outage may be tens of thousands, those of the next
	// few. Memory follows the doubts, not the largest round in doubt, and
	// once none is left (the outage over) the buffer goes too: a healthy
	// Redis leaves none, so it is not made again round after round.
	if n == 0 || cap(r.doubts) > 4*max(n, maxBatch) {
		r.doubts = nil
	} else {
		clear(r.doubts)
		r.doubts = r.doubts[:0]
	}
}

// clearInDoubt empties r.inDoubt for n keys, in a new map when the one it
// has held many more (a map keeps its size once grown).
func (r *Reconciler) clearInDoubt(n int) {
	if r.inDoubtPeak > 4*max(n, maxBatch) {
		r.inDoubt, r.inDoubtPeak = make(map[string]bool, n), 0
		return
	}
	clear(r.inDoubt)
}
