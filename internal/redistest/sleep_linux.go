//go:build linux

package redistest

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// newSleeper returns a timerfd sleeper, or a timer one if the kernel gives
// no timerfd.
//
// A Go timer of less than a few milliseconds fires up to a millisecond late
// when the process is idle: the runtime then waits for timers in epoll_wait,
// whose timeout is in whole milliseconds (a delay of 100µs takes about
// 1.1ms, one of 2.5ms about 3.2ms). A timerfd is an hrtimer of the kernel
// that the runtime polls as it polls a socket: it wakes the waiting
// goroutine within tens of microseconds, idle or not.
func newSleeper() sleeper {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return newTimerSleeper()
	}
	f := os.NewFile(fd, "timerfd")
	rc, err := f.SyscallConn()
	// A file the runtime does not poll would block a thread in Read: only
	// a polled one takes deadlines.
	if err != nil || f.SetReadDeadline(time.Time{}) != nil {
		f.Close()
		return newTimerSleeper()
	}
	return &fdSleeper{f: f, rc: rc}
}

// clockMonotonic is CLOCK_MONOTONIC.
const clockMonotonic = 1

// fdSleeper sleeps on a timerfd. It is used by one goroutine at a time;
// close may be called from any.
type fdSleeper struct {
	f   *os.File
	rc  syscall.RawConn
	buf [8]byte // the expirations read
}

// itimerspec is struct itimerspec.
type itimerspec struct {
	interval, value syscall.Timespec
}

func (s *fdSleeper) sleep(until time.Time, done <-chan struct{}) bool {
	wait := time.Until(until)
	if wait < spinBelow {
		return spin(until, done)
	}
	its := itimerspec{value: syscall.NsecToTimespec(int64(wait))}
	var errno syscall.Errno
	// Control holds the descriptor open meanwhile: a close cannot hand its
	// number to another file under the call.
	if err := s.rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&its)), 0, 0, 0)
	}); err != nil || errno != 0 {
		return false
	}
	_, err := s.f.Read(s.buf[:])
	return err == nil
}

func (s *fdSleeper) close() { s.f.Close() }
