//go:build !linux

package bench

import (
	"errors"
	"time"
)

// procCPU is not measured here: it reads Linux's /proc.
func procCPU(int) (time.Duration, error) {
	return 0, errors.New("bench: a process's CPU time is read from Linux's /proc")
}

// selfCPU is not measured here.
func selfCPU() time.Duration { return 0 }
