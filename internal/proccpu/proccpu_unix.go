//go:build unix

package proccpu

import (
	"syscall"
	"time"
)

// Used returns the CPU time this process has used so far, user and system;
// false if the system cannot tell.
func Used() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
