package bench

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid"
)

// work is a worker's loop: take the instance's next arrival, wait for its
// time, decide. It returns when the arrivals or the duration run out, or
// ctx ends.
func (r *run) work(ctx context.Context, in *instance, w *worker, start time.Time) {
	if r.sc.Closed {
		r.workClosed(ctx, in, w, start)
		return
	}
	d := r.sc.Duration
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		at, k := in.sched.take()
		if at >= d {
			return
		}
		due := start.Add(at)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		now := time.Now()
		if now.Sub(start) >= d {
			return // behind, and out of time
		}
		if now.Sub(due) > LateAfter {
			w.late.Add(1)
		}
		ok, src, err := in.dec.decide(ctx, r.keys[k], r.sc.Cost)
		took := time.Since(now)
		w.hist.Record(took)
		out := r.inOutage(now.Sub(start))
		if out {
			w.outHist.Record(took)
		}
		if err != nil {
			if ctx.Err() != nil {
				return // stopped, not broken
			}
			w.failed(err, out)
			continue
		}
		r.count(w, k, ok, src, out)
	}
}

// count records an answered decision of w on key k.
func (r *run) count(w *worker, k int, ok bool, src hybrid.Source, out bool) {
	if w.keyAsked != nil {
		w.keyAsked[k]++
	} else {
		r.asked[k].Add(1)
	}
	w.decisions.Add(1)
	if out {
		w.outDecisions++
	}
	switch src {
	case hybrid.SourceFallback:
		w.fallback.Add(1)
		if out {
			w.outFallback++
		}
	case hybrid.SourceRedis:
		w.redis.Add(1)
	}
	if ok {
		if w.keyAdmitted != nil {
			w.keyAdmitted[k]++
		} else {
			r.admitted[k].Add(1)
		}
		w.admitted.Add(1)
	}
}

// closedYield is how many decisions a closed-loop worker makes between two
// yields of its core; closedSample how many between two timed decisions.
const (
	closedYield  = 64
	closedSample = 16
)

// workClosed is a worker's closed loop: decide, and decide again as soon as
// answered, until the duration runs out or ctx ends, or in a long tail
// until the worker has asked each key of its list (w.tail). One decision in
// closedSample is timed (two clock reads would double the bench's own cost
// per decision), every one in a long tail, and the clock read then tells
// whether the run is over and whether Redis is down.
func (r *run) workClosed(ctx context.Context, in *instance, w *worker, start time.Time) {
	end := start.Add(r.sc.Duration)
	out := false
	// The worker's counters, added to its shared ones at each yield: an
	// atomic add per decision would cost more than a hot key's decision.
	var dec, adm, fb, red int64
	flush := func() {
		w.decisions.Add(dec)
		w.admitted.Add(adm)
		w.fallback.Add(fb)
		w.redis.Add(red)
		dec, adm, fb, red = 0, 0, 0, 0
	}
	defer flush()
	for i := 0; ; i++ {
		if i%closedYield == closedYield-1 {
			flush()
			// A request handler blocks on I/O now and then; a worker that
			// never does keeps the goroutines that Redis's replies woke
			// waiting for a core for many scheduler time slices, and the
			// limiter's calls time out for want of CPU, not of Redis.
			runtime.Gosched()
		}
		k := 0
		switch {
		case w.tail != nil:
			if i == len(w.tail) {
				return
			}
			k = int(w.tail[i])
		case w.zipf != nil:
			k = int(w.zipf.Uint64())
		case r.sc.Keys > 1:
			k = w.rng.IntN(r.sc.Keys)
		}
		var t0 time.Time
		// A long tail times every decision: each is a round trip's worth,
		// against which two clock reads cost nothing, and one in
		// closedSample would time every worker's first decision (its
		// connection dialled, its scripts loaded), a sixteenth of the
		// samples a run of a few hundred asks a worker, and make the
		// start-up the p99.
		timed := w.tail != nil || i%closedSample == 0
		if timed {
			t0 = time.Now()
			if !t0.Before(end) || ctx.Err() != nil {
				return
			}
			out = r.inOutage(t0.Sub(start))
		}
		ok, src, err := in.dec.decide(ctx, r.keys[k], r.sc.Cost)
		if timed {
			took := time.Since(t0)
			w.hist.Record(took)
			if out {
				w.outHist.Record(took)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.failed(err, out)
			continue
		}
		dec++
		if w.keyAsked != nil {
			w.keyAsked[k]++
		} else {
			r.asked[k].Add(1)
		}
		if out {
			w.outDecisions++
		}
		switch src {
		case hybrid.SourceFallback:
			fb++
			if out {
				w.outFallback++
			}
		case hybrid.SourceRedis:
			red++
		}
		if ok {
			adm++
			if w.keyAdmitted != nil {
				w.keyAdmitted[k]++
			} else {
				r.admitted[k].Add(1)
			}
		}
	}
}

// report samples the workers' counters once a second until done is
// closed, calls progress with them, and returns the timeline.
func (r *run) report(start time.Time, done <-chan struct{}, progress func(Progress)) []Sample {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var timeline []Sample
	var lastDec, lastAdm, lastFb int64
	last := start
	for {
		stop := false
		select {
		case <-done:
			stop = true
		case <-tick.C:
		}
		now := time.Now()
		var p Progress
		var fb int64
		for _, in := range r.insts {
			for _, w := range in.workers {
				p.Decisions += w.decisions.Load()
				p.Admitted += w.admitted.Load()
				p.Errors += w.errors.Load()
				fb += w.fallback.Load()
			}
		}
		if p.Decisions > lastDec || !stop {
			timeline = append(timeline, Sample{
				At:        now.Sub(start).Seconds(),
				Decisions: p.Decisions - lastDec,
				Admitted:  p.Admitted - lastAdm,
				Fallback:  fb - lastFb,
				Degraded:  r.degraded(),
			})
		}
		if stop {
			return timeline
		}
		p.Mode, p.Elapsed, p.Duration, p.Asks = r.mode, now.Sub(start), r.sc.Duration, r.sc.asks()
		p.Rate = float64(p.Decisions-lastDec) / now.Sub(last).Seconds()
		lastDec, lastAdm, lastFb, last = p.Decisions, p.Admitted, fb, now
		if progress != nil {
			progress(p)
		}
	}
}

// schedule is an instance's arrivals: a Poisson process, and a key drawn
// for each arrival. It is safe for concurrent use.
type schedule struct {
	mu   sync.Mutex // protects the fields below
	rng  *rand.Rand
	zipf *rand.Zipf // nil: uniform
	keys int
	gap  float64 // mean nanoseconds between arrivals
	next float64 // nanoseconds from the start to the last arrival taken
}

// take returns the time of the next arrival, from the start, and its key.
func (s *schedule) take() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next += s.rng.ExpFloat64() * s.gap
	k := 0
	switch {
	case s.zipf != nil:
		k = int(s.zipf.Uint64())
	case s.keys > 1:
		k = s.rng.IntN(s.keys)
	}
	return time.Duration(s.next), k
}

// failed counts a decision of w that failed with err (in the outage if out),
// and keeps the first such error.
func (w *worker) failed(err error, out bool) {
	w.errors.Add(1)
	if out {
		w.outErrors++
	}
	if w.firstErr == nil {
		w.firstErr = err
	}
}
