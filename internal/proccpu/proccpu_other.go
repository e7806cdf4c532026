//go:build !unix

package proccpu

import "time"

// Used reports false: only Unix systems tell a process its CPU time here.
func Used() (time.Duration, bool) { return 0, false }
