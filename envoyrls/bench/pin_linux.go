//go:build linux

package bench

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// split is the processors of this process's affinity in two halves: the
// load generator's (and the latency proxy's) and the services' and Redis's,
// so that neither takes the other's processors, as in a deployment where
// Envoy runs on other hosts.
type split struct {
	all, load, service unix.CPUSet
}

// newSplit splits the processors this process may run on: the first half
// (rounded down) for the load, the rest for the services; an error with
// fewer than two.
func newSplit() (*split, error) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return nil, fmt.Errorf("bench: reading the processors: %w", err)
	}
	n := all.Count()
	if n < 2 {
		return nil, fmt.Errorf("bench: %d processor, want two at least to split", n)
	}
	s := &split{all: all}
	seen := 0
	for cpu := 0; seen < n; cpu++ {
		if !all.IsSet(cpu) {
			continue
		}
		if seen < n/2 {
			s.load.Set(cpu)
		} else {
			s.service.Set(cpu)
		}
		seen++
	}
	return s, nil
}

// String names the halves.
func (s *split) String() string {
	return fmt.Sprintf("the load on processors %s, the services and Redis on %s", cpuList(&s.load), cpuList(&s.service))
}

// cpuList returns the processors of set, as "0,1".
func cpuList(set *unix.CPUSet) string {
	var b []byte
	for cpu, seen := 0, 0; seen < set.Count(); cpu++ {
		if set.IsSet(cpu) {
			if seen > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(cpu), 10)
			seen++
		}
	}
	return string(b)
}

// pinSelf moves every thread of this process to the load's processors (the
// threads it makes later inherit them) and sets GOMAXPROCS to their count;
// it returns the function that gives the process all of them and its
// GOMAXPROCS back. The processes this one starts inherit the load's
// processors until pinService moves them.
func (s *split) pinSelf() (restore func(), err error) {
	if err := pin(os.Getpid(), &s.load); err != nil {
		return nil, err
	}
	old := runtime.GOMAXPROCS(s.load.Count())
	return func() {
		pin(os.Getpid(), &s.all) // best effort: the test's end
		runtime.GOMAXPROCS(old)
	}, nil
}

// pinService moves every thread of process pid to the services'
// processors. Threads it makes after inherit them; a service's start may
// make some while this runs, so it is called again once the service
// answers.
func (s *split) pinService(pid int) error { return pin(pid, &s.service) }

// serviceProcs is GOMAXPROCS for a Go service on the services' processors:
// it starts with the load's, which it inherits.
func (s *split) serviceProcs() int { return s.service.Count() }

// pin sets the affinity of every thread of process pid to set.
func pin(pid int, set *unix.CPUSet) error {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("bench: pinning %d: %w", pid, err)
	}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: the thread has exited
			return fmt.Errorf("bench: pinning thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}
