//go:build linux

package redistest

import "syscall"

// sysProcAttr makes the kernel kill redis-server when the thread that
// started it exits, so servers do not outlive a test binary that is killed.
// Go only ends a thread when a goroutine locked to it exits, which callers of
// this package do not do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// freezeSignals returns the signals that stop a process and let it go on.
func freezeSignals() (stop, cont syscall.Signal, ok bool) {
	return syscall.SIGSTOP, syscall.SIGCONT, true
}
