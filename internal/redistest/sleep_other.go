//go:build !linux

package redistest

// newSleeper returns a sleeper on a Go timer.
func newSleeper() sleeper { return newTimerSleeper() }
