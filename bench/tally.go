package bench

// tally is what a run's instances counted, in a form that the instances
// of several processes can add up (see RunProcs).
type tally struct {
	Hist, OutHist Histogram

	Decisions, Admitted, Late, Fallback, Redis, Errors int64
	OutDecisions, OutFallback, OutErrors               int64
	FirstError                                         string

	// Per key: requests asked and admitted.
	Asked, KeyAdmitted []int64

	Tracked              int
	RedisErrors, Breaker uint64
	// Health sums the hybrid Limiters' statistics; Hybrid reports that
	// there were some.
	Health   Health
	Hybrid   bool
	Commands int64
	// Sent counts the commands sent by name, in a long tail only.
	Sent map[string]int64 `json:",omitempty"`
	// HeapGrowth is the growth of the live heap over the run, in bytes.
	HeapGrowth int64
	// OvershootBound is Limiter.Overshoot, for optimistic mode.
	OvershootBound int64
}

// add adds o to t.
func (t *tally) add(o *tally) {
	t.Hist.Merge(&o.Hist)
	t.OutHist.Merge(&o.OutHist)
	t.Decisions += o.Decisions
	t.Admitted += o.Admitted
	t.Late += o.Late
	t.Fallback += o.Fallback
	t.Redis += o.Redis
	t.Errors += o.Errors
	t.OutDecisions += o.OutDecisions
	t.OutFallback += o.OutFallback
	t.OutErrors += o.OutErrors
	if t.FirstError == "" {
		t.FirstError = o.FirstError
	}
	if t.Asked == nil {
		t.Asked, t.KeyAdmitted = make([]int64, len(o.Asked)), make([]int64, len(o.KeyAdmitted))
	}
	for i := range min(len(t.Asked), len(o.Asked)) {
		t.Asked[i] += o.Asked[i]
		t.KeyAdmitted[i] += o.KeyAdmitted[i]
	}
	t.Tracked += o.Tracked
	t.RedisErrors += o.RedisErrors
	t.Breaker += o.Breaker
	t.Health.add(o.Health)
	t.Hybrid = t.Hybrid || o.Hybrid
	t.Commands += o.Commands
	for name, n := range o.Sent {
		if t.Sent == nil {
			t.Sent = make(map[string]int64)
		}
		t.Sent[name] += n
	}
	t.HeapGrowth += o.HeapGrowth
	t.OvershootBound = max(t.OvershootBound, o.OvershootBound)
}

// tally adds up what r's workers and instances counted. Call it once the
// workers have returned, before the limiters are closed. heapBefore,
// cmdsBefore and sentBefore are the live heap, the commands sent and the
// commands sent by name before the run.
func (r *run) tally(heapBefore uint64, cmdsBefore int64, sentBefore map[string]int64) tally {
	var t tally
	t.Commands = r.commands() - cmdsBefore
	if r.sc.Passes > 0 {
		t.Sent = r.sent()
		for name, n := range sentBefore {
			t.Sent[name] -= n
		}
	}
	for _, in := range r.insts {
		for _, w := range in.workers {
			t.Hist.Merge(&w.hist)
			t.OutHist.Merge(&w.outHist)
			t.OutDecisions += w.outDecisions
			t.OutFallback += w.outFallback
			t.OutErrors += w.outErrors
			t.Decisions += w.decisions.Load()
			t.Admitted += w.admitted.Load()
			t.Late += w.late.Load()
			t.Fallback += w.fallback.Load()
			t.Redis += w.redis.Load()
			t.Errors += w.errors.Load()
			if w.firstErr != nil && t.FirstError == "" {
				t.FirstError = w.firstErr.Error()
			}
		}
	}
	t.Asked, t.KeyAdmitted = r.perKey()
	for _, in := range r.insts {
		t.Tracked += in.dec.tracked()
		if d, ok := in.dec.(*hybridDecider); ok {
			var h Health
			h.observe(d.l.Stats())
			t.RedisErrors += h.errors()
			t.Breaker += h.Transitions
			t.Health.add(h)
			t.Hybrid = true
		}
	}
	t.HeapGrowth = int64(heapAlloc()) - int64(heapBefore)
	if r.mode == Optimistic && len(r.insts) > 0 {
		t.OvershootBound = r.insts[0].dec.(*hybridDecider).l.Overshoot(r.lim)
	}
	return t
}

// perWorkerKeys is the most keys for which each worker counts requests per
// key on its own.
const perWorkerKeys = 4096

// perKey returns the requests asked and admitted per key, summed over the
// workers. Call it once the workers have returned.
func (r *run) perKey() (asked, admitted []int64) {
	asked, admitted = make([]int64, len(r.keys)), make([]int64, len(r.keys))
	for i := range r.keys {
		asked[i], admitted[i] = r.asked[i].Load(), r.admitted[i].Load()
	}
	for _, in := range r.insts {
		for _, w := range in.workers {
			for i := range w.keyAsked {
				asked[i] += w.keyAsked[i]
				admitted[i] += w.keyAdmitted[i]
			}
		}
	}
	return asked, admitted
}

// commands returns the Redis commands the fleet has sent.
func (r *run) commands() int64 {
	var n int64
	for _, in := range r.insts {
		n += in.cmds.Load()
	}
	return n
}
