//go:build !unix

package hybrid_test

import "time"

// processCPU reports false: the system cannot tell the process's CPU time.
func processCPU() (time.Duration, bool) { return 0, false }
