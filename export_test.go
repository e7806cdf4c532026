package hybrid

import "time"

// SetFirstRound makes the Limiters New returns from now on start their
// rounds d after New (0: one sync interval), and returns a function that
// undoes it.
func SetFirstRound(d time.Duration) (undo func()) {
	old := firstRound
	firstRound = func(si time.Duration) time.Duration {
		if d == 0 {
			return si
		}
		return d
	}
	return func() { firstRound = old }
}
