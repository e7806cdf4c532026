package redistest

import (
	"runtime"
	"sync"
	"time"
)

// sleeper waits until a moment, for one goroutine of the proxy: the writer
// of one direction of a connection, which holds each chunk until it is due.
type sleeper interface {
	// sleep returns true at until, or at once if until has passed, and
	// false if done or the sleeper is closed first.
	sleep(until time.Time, done <-chan struct{}) bool
	// close releases the sleeper and ends a sleep under way. It may be
	// called from any goroutine, and more than once.
	close()
}

// spinBelow is the wait under which a sleeper yields its core until the
// moment comes rather than arm a timer: the wake-up from a timer takes tens
// of microseconds, and a goroutine parked on it while the process is busy
// waits for the runtime to poll (a proxy with 1µs of latency did a fifth of
// the round trips per second it did without any).
const spinBelow = 20 * time.Microsecond

// spin yields the core until until, and returns true; false if done is
// closed first.
func spin(until time.Time, done <-chan struct{}) bool {
	for time.Now().Before(until) {
		select {
		case <-done:
			return false
		default:
		}
		runtime.Gosched()
	}
	return true
}

// timerSleeper sleeps on a Go timer: precise to about a millisecond when
// the process is idle (see newSleeper).
type timerSleeper struct {
	t      *time.Timer
	closed chan struct{}
	once   sync.Once // closes closed
}

func newTimerSleeper() *timerSleeper {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &timerSleeper{t: t, closed: make(chan struct{})}
}

func (s *timerSleeper) sleep(until time.Time, done <-chan struct{}) bool {
	wait := time.Until(until)
	if wait < spinBelow {
		return spin(until, done)
	}
	s.t.Reset(wait)
	select {
	case <-s.t.C:
		return true
	case <-done:
	case <-s.closed:
	}
	s.t.Stop()
	return false
}

func (s *timerSleeper) close() { s.once.Do(func() { close(s.closed) }) }
