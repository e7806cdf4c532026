//go:build !linux

package bench

import "errors"

// split is Linux's: processor affinity is set through its system calls.
type split struct{}

func newSplit() (*split, error) {
	return nil, errors.New("bench: splitting the processors needs Linux's sched_setaffinity")
}

func (*split) String() string                       { return "" }
func (*split) pinSelf() (restore func(), err error) { return func() {}, nil }
func (*split) pinService(int) error                 { return nil }
func (*split) serviceProcs() int                    { return 0 }
