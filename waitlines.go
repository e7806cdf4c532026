package hybrid

import (
	"sync"
	"time"
)

// waitLines holds the line of each key that WaitN calls are waiting on:
// when the next of them is to try again.
type waitLines struct {
	mu    sync.Mutex
	lines map[string]*waitLine
}

// waitLine is one key's line.
type waitLine struct {
	next    time.Duration // on the Limiter's clock: the turn of the next waiter to take one
	waiters int
}

// join puts a waiter in key's line.
func (w *waitLines) join(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lines == nil {
		w.lines = make(map[string]*waitLine)
	}
	ln := w.lines[key]
	if ln == nil {
		ln = &waitLine{}
		w.lines[key] = ln
	}
	ln.waiters++
}

// leave takes a waiter out of key's line; the last one out drops the line.
func (w *waitLines) leave(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ln := w.lines[key]; ln != nil {
		if ln.waiters--; ln.waiters <= 0 {
			delete(w.lines, key)
		}
	}
}

// turn returns how long after now a waiter in key's line, told to retry
// after retry, sleeps: until retry, or until the turn after the last one
// taken, whichever is later. Each turn taken moves the next one each later.
// A waiter that had a turn already (had: it was denied again when it came)
// keeps its place: it sleeps retry, and the turn after it moves to each
// after that if it was sooner. Taking a new turn instead cost a lone
// waiter a whole turn whenever its retry came a microsecond early (a view
// rounded to Redis's microseconds): 18 tokens of 21 at 1 a second.
func (w *waitLines) turn(key string, now, retry, each time.Duration, had bool) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	ln := w.lines[key]
	if had {
		ln.next = max(ln.next, now+retry+each)
		return retry
	}
	at := max(now+retry, ln.next)
	ln.next = at + each
	return at - now
}
