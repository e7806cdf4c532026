package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// batcher coalesces the settlements that requests need from one Redis node
// now, for whatever keys (lease fetches, takes, exact decisions), into one
// Settle: one round trip, and on a single Redis one script call for up to
// 100 keys, which costs Redis about half as much a key as a call each.
//
// There is no timer. A request that finds fewer batches on their way than
// the node's window allows (see window) sends its own at once, from its own
// goroutine, with whatever waits already; the ones that come while the
// window is full wait and go together in the next, which the first batch
// back hands to one of the node's flushers (maxWindow goroutines that live
// as long as the Reconciler, made at the first hand-off). So an idle
// limiter adds no delay, and a busy one sends a batch as soon as the window
// has room, as large as the requests that came meanwhile (at most
// maxBatchKeys; more wait for the next).
type batcher struct {
	mu       sync.Mutex
	queue    []*waiter
	flights  int            // batches on their way, or handed to a flusher
	win      window         // how many batches may be on their way
	work     chan []*waiter // batches handed to the flushers
	flushers bool           // the flushers were started
	closed   bool           // the flushers stopped: nothing more is handed
	spare    [][]*waiter    // batches' slices to reuse
	bufs     []*flightBufs  // the Settle buffers of batches back, to reuse
}

// alone reports whether this instance is alone in its fleet, as the last
// heartbeat counted it (see window's floor).
func (r *Reconciler) alone() bool { return r.live.Load() <= 1 }

// maxBatchKeys is the most settlements one batch carries: ten script calls
// on a single Redis.
const maxBatchKeys = 1000

// waiter is one settlement in a batch and, once the batch is back, its
// outcome: done receives one value then.
type waiter struct {
	s    global.Settlement
	rep  global.Reply
	err  error // the batch's own: the breaker refused it, or no reply came
	done chan struct{}
	// queued reports that the settlement found the node's window full and
	// waited for a batch on its way to come back, from the clock reading
	// at (Stats.Queued, QueueWait).
	queued bool
	at     time.Duration
}

// SettleNow settles s through the batch of the node that holds s.Key, and
// returns its reply, or the batch's error (the breaker refused the round
// trip, no reply came, the Reconciler is closed). It waits no longer than
// ctx: a caller that gives up leaves the settlement in its batch, applied or
// not, and gets ctx's error; one whose ctx is done already sends nothing.
//
// A call whose connection broke under it (EOF, a reset: a pooled connection
// that the server or a middlebox closed while it was idle) is sent once
// more, on another connection, before its error is returned: one broken
// connection says nothing of Redis, and its callers would otherwise be
// decided by the fallback policy on a Redis that is up. A Redis that went
// down fails the second call too (a refused connection). Sent again, a
// numbered settlement is applied once; one that is not (a decision, a fetch
// for its requests alone) may be applied twice if the first reached Redis,
// which takes twice, towards denying.
func (r *Reconciler) SettleNow(ctx context.Context, s global.Settlement) (global.Reply, error) {
	rep, _, err := r.settleNowUntil(ctx, s, nil)
	return rep, err
}

// SettleNowBy is SettleNow for a request that must be answered by the
// clock reading by (see ColdBy): past it, it gives up with an error
// wrapping ErrNoAnswer, and leaves the settlement in its batch, applied or
// not, as a caller that gives up on ctx does.
func (r *Reconciler) SettleNowBy(ctx context.Context, s global.Settlement, by time.Duration) (global.Reply, error) {
	d := deadline{r: r, wait: r.left(by)}
	defer d.stop()
	rep, w, err := r.settleNowUntil(ctx, s, &d)
	if w != nil && errors.Is(err, ErrNoAnswer) {
		r.stats.fetchTimeouts.Add(1)
		err = fmt.Errorf("reconcile: settle %q: %w within %v", s.Key, ErrNoAnswer, r.cfg.ColdWait)
	}
	return rep, err
}

// settleNowUntil is SettleNow that also gives up at timeout (with
// ErrNoAnswer). A caller that gave up, on timeout or ctx, gets the waiter
// of its settlement, still in its batch (see settleWait).
func (r *Reconciler) settleNowUntil(ctx context.Context, s global.Settlement, timeout *deadline) (global.Reply, *waiter, error) {
	if s.Seq == 0 {
		// Soon after an outage, numbered to carry its start: an exact
		// decision may be the first write once Redis is back (see
		// markOutage).
		if r.markOutage(&s); !s.Since.IsZero() {
			s.Instance, s.Seq = r.fetchID, r.fetchSeq.Add(1)
		}
	}
	rep, w, err := r.settleWait(ctx, s, timeout)
	first := callErr(rep, err)
	if w != nil || !broken(first) {
		return rep, w, err
	}
	r.stats.resent.Add(1)
	rep, w, err = r.settleWait(ctx, s, timeout)
	if again := callErr(rep, err); w == nil && again != nil && !mayBeApplied(again) {
		// The second surely was not applied (refused by the breaker or
		// the network), but the first may have been: its error stands, so
		// that a numbered settlement stays in doubt rather than have its
		// give-back made twice.
		return rep, nil, first
	}
	return rep, w, err
}

// callErr returns the error of a call that returned rep and err: err, else
// the reply's own.
func callErr(rep global.Reply, err error) error {
	if err != nil {
		return err
	}
	return rep.Err
}

// broken reports whether err says that the connection of a call broke
// (the peer closed or reset it), rather than that Redis refused or failed
// the call or did not answer in time.
func broken(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// settleWait is SettleNow's one call, which also gives up at timeout (with
// ErrNoAnswer). A caller that gave up gets the waiter of its settlement,
// still in its batch (nil otherwise): its done receives one value once the
// batch is back, and reply then returns the outcome. A caller with a
// timeout does not send its batch itself if the call may take longer than
// it waits (ColdWait below the breaker's call timeout): it hands it to the
// node's flushers.
func (r *Reconciler) settleWait(ctx context.Context, s global.Settlement, timeout *deadline) (global.Reply, *waiter, error) {
	if r.Closed() {
		return global.Reply{}, nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return global.Reply{}, nil, err
	}
	n := r.def
	if r.router != nil {
		lctx, cancel := context.WithTimeout(ctx, r.callTimeout)
		n = r.nodeOf(lctx, s.Key)
		cancel()
	}
	w, _ := r.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{done: make(chan struct{}, 1)}
	}
	w.s = s
	b := &n.batch
	b.mu.Lock()
	b.queue = append(b.queue, w)
	if !b.win.allows(b.flights, r.alone()) {
		w.queued, w.at = true, r.clock.Now()
		b.mu.Unlock()
	} else if b.flights++; timeout == nil || r.callTimeout <= r.cfg.ColdWait {
		batch := b.take()
		b.mu.Unlock()
		r.flush(n, batch, false)
	} else {
		// A caller that waits less than a call may take (ColdWait below
		// the breaker's call timeout) does not make the call itself.
		r.hand(n, b.take())
	}
	select {
	case <-w.done:
	default: // not back yet (a caller that sent its batch itself has it)
		select {
		case <-w.done:
		case <-ctx.Done():
			return global.Reply{}, w, ctx.Err() // w stays with its batch
		case <-timeout.c():
			return global.Reply{}, w, ErrNoAnswer
		}
	}
	rep, err := r.reply(w)
	return rep, nil, err
}

// reply returns the outcome of w, a waiter whose done received its value,
// and keeps w for another settlement.
func (r *Reconciler) reply(w *waiter) (global.Reply, error) {
	rep, err := w.rep, w.err
	*w = waiter{done: w.done}
	r.waiters.Put(w)
	return rep, err
}

// take takes the next batch out of the queue. b.mu is held.
func (b *batcher) take() []*waiter {
	n := min(len(b.queue), maxBatchKeys)
	var batch []*waiter
	if k := len(b.spare); k > 0 {
		batch, b.spare = b.spare[k-1][:0], b.spare[:k-1]
	}
	batch = append(batch, b.queue[:n]...)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// flush sends batch to node n through its breaker and gives each waiter
// its outcome; if requests came meanwhile, it hands the next batch to one of
// the node's flushers: the caller that sent this one goes back to its
// request. A flusher (wave true) first lets the callers it answered ask
// again (see awaitWave).
func (r *Reconciler) flush(n *node, batch []*waiter, wave bool) {
	b := &n.batch
	b.mu.Lock()
	var fb *flightBufs
	if k := len(b.bufs); k > 0 {
		fb, b.bufs = b.bufs[k-1], b.bufs[:k-1]
	} else {
		fb = new(flightBufs)
	}
	b.win.sent(len(batch))
	b.mu.Unlock()
	sets, replies := fb.sets[:0], fb.replies[:0]
	for _, w := range batch {
		sets = append(sets, w.s)
		replies = append(replies, global.Reply{})
	}
	r.stats.batches.Add(1)
	r.stats.batched.Add(uint64(len(batch)))
	start := r.clock.Now()
	for _, w := range batch {
		if w.queued {
			r.stats.queued.Add(1)
			r.stats.queueWait.observe(start - w.at)
		}
	}
	err := r.call(context.Background(), n, len(sets), func(ctx context.Context) error {
		if err := r.st.Settle(ctx, sets, replies); err != nil {
			return err
		}
		return refusal(replies)
	})
	end := r.clock.Now()
	if err == nil {
		r.stats.batchTrip.observe(end - start)
	}
	answered, alone := len(batch), r.alone()
	b.mu.Lock()
	// The window counts the requests outstanding before this batch's
	// callers can ask again: one that did would be counted twice, on its
	// way and waiting (see window.back).
	waiting := len(b.queue)
	if err == nil {
		b.win.back(answered, waiting, end-start, end, alone)
	} else {
		b.win.failed(answered)
	}
	b.mu.Unlock()
	for i, w := range batch {
		w.rep, w.err = replies[i], err
		if hasReply(&replies[i]) {
			// Its own reply came, though the call failed for the
			// breaker (another key's write refused: see refusal): it
			// was applied, and is answered by it.
			w.err = nil
		}
		w.done <- struct{}{}
	}
	clear(batch)
	clear(sets)
	clear(replies)
	fb.sets, fb.replies = sets, replies
	if wave {
		b.awaitWave(answered, waiting)
	}
	b.mu.Lock()
	if len(b.spare) < maxWindow {
		b.spare = append(b.spare, batch)
	}
	if len(b.bufs) < maxWindow && cap(sets) <= maxBatchKeys {
		b.bufs = append(b.bufs, fb)
	}
	if len(b.queue) == 0 || !b.win.allows(b.flights-1, alone) { // the window closed: another flight takes the queue
		b.flights--
		b.mu.Unlock()
		return
	}
	r.hand(n, b.take())
}

// hand hands batch, a flight of node n's, to one of the node's flushers,
// and unlocks n.batch.mu, which the caller holds.
func (r *Reconciler) hand(n *node, batch []*waiter) {
	b := &n.batch
	if !b.flushers {
		// A flusher for each batch that may be handed at once (one that
		// waited for another's flusher would wait for an unrelated
		// reply), all made at the first hand-off, so that their number
		// does not grow with the window later.
		b.flushers = true
		b.work = make(chan []*waiter, maxWindow)
		for range maxWindow {
			if !r.goOwned(func() { r.flusher(n) }) {
				b.closed = true
				break
			}
		}
	}
	if b.closed {
		b.flights--
		b.mu.Unlock()
		answerClosed(batch)
		return
	}
	b.work <- batch // never blocks: at most maxWindow batches are handed or on their way
	b.mu.Unlock()
}

// awaitWave gives the processor up, at most answered-1 times, while fewer
// than answered requests have come since the batch was answered (waiting
// were there before): the callers a batch has just answered, each on a
// goroutine made ready by its answer, often ask again at once (a worker
// pool, a client's next request), and a batch sent before they do carries
// only the requests that came while it was on its way, while theirs wait a
// whole round trip more. Then the batches stay as deep as the callers are
// many, rather than split in two that take turns (counting the requests
// that were waiting, not only the length of the queue, is what joins two
// halves of equal size), and each costs Redis one call and the process one
// write and one read.
// There is no timer: a yield returns at once when nothing else is ready to
// run, and a batch of one (a light load) does not yield at all. The idea is
// go-redis's AutoPipeline's (expected arrivals after a batch completes).
// Measured with hybridbench -passes 3 -keys 50000 -rate 10 -burst 20: 8
// instances x 8 goroutines, lease 66-78k -> 87-89k decisions/s, exact
// 70-75k -> 86-92k, script calls a decision 0.26 -> 0.14 (0.16-0.20 when
// the queue's length alone was counted); 4 x 8, lease +7%, exact +20%;
// 1 x 32, calls a decision 0.11 -> 0.08; light load (-demand 0.02) p99
// unchanged. TestBatchWave shows it on one processor.
func (b *batcher) awaitWave(answered, waiting int) {
	want := min(waiting+answered, maxBatchKeys)
	for range answered - 1 {
		b.mu.Lock()
		short := len(b.queue) < want
		b.mu.Unlock()
		if !short {
			return
		}
		runtime.Gosched()
	}
}

// flusher sends the batches handed to it, until the Reconciler closes; then
// it answers those still handed with ErrClosed.
func (r *Reconciler) flusher(n *node) {
	b := &n.batch
	for {
		select {
		case batch := <-b.work:
			r.flush(n, batch, true)
		case <-r.done:
			b.mu.Lock()
			b.closed = true
			for {
				select {
				case batch := <-b.work:
					b.flights--
					answerClosed(batch)
					continue
				default:
				}
				break
			}
			b.mu.Unlock()
			return
		}
	}
}

// hasReply reports whether rep is a reply Redis gave: a settlement applied,
// not one that failed or got no reply.
func hasReply(rep *global.Reply) bool { return rep.Err == nil && !rep.Now.IsZero() }

// flightBufs are the buffers of one batch's Settle call.
type flightBufs struct {
	sets    []global.Settlement
	replies []global.Reply
}

// answerClosed answers the waiters of batch with ErrClosed.
func answerClosed(batch []*waiter) {
	for _, w := range batch {
		w.err = ErrClosed
		w.done <- struct{}{}
	}
}
