//go:build linux

package bench

import "syscall"

// sysProcAttr makes the kernel kill a shard when the thread that started it
// exits, so that shards do not outlive a parent that is killed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
