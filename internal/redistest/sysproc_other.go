//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux can tie the child's life to ours, so
// elsewhere a killed test binary may leave its servers running.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}

// freezeSignals reports that Freeze is not supported here.
func freezeSignals() (stop, cont syscall.Signal, ok bool) {
	return 0, 0, false
}
