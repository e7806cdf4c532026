//go:build !race

package config_test

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
