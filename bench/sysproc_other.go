//go:build !linux

package bench

import "syscall"

// sysProcAttr returns nil: only Linux can tie a shard's life to its
// parent's.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
