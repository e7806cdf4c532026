//go:build linux

package bench

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStatCPU(t *testing.T) {
	// A command with a space and a parenthesis; utime 250, stime 70 ticks.
	stat := "4242 (hybrid rls) x) S 1 4242 4242 0 -1 4194560 1543 0 0 0 250 70 0 0 20 0 9 0 12345 1000 300 18446744073709551615\n"
	got, err := statCPU(stat)
	if err != nil || got != 3200*time.Millisecond {
		t.Errorf("statCPU = %v, %v; want 3.2s", got, err)
	}
	for _, bad := range []string{"", "4242 (x", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 1543 0 0 0 u 70 0"} {
		if _, err := statCPU(bad); err == nil {
			t.Errorf("statCPU(%q): no error", bad)
		}
	}
}

func TestProcCPU(t *testing.T) {
	start := time.Now()
	for time.Since(start) < 30*time.Millisecond { // spin: CPU time to see
	}
	got, err := procCPU(os.Getpid())
	if err != nil || got <= 0 {
		t.Errorf("procCPU(self) = %v, %v; want some", got, err)
	}
	if self := selfCPU(); self < got-clockTick {
		t.Errorf("selfCPU = %v, below procCPU's %v", self, got)
	}
}

func TestSplit(t *testing.T) {
	s, err := newSplit()
	if err != nil {
		t.Skip(err) // one processor
	}
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if n := all.Count(); s.load.Count() != n/2 || s.service.Count() != n-n/2 {
		t.Errorf("split of %d processors: %s, want %d and %d", n, s, n/2, n-n/2)
	}
	for cpu := range 1024 {
		if s.load.IsSet(cpu) && s.service.IsSet(cpu) || all.IsSet(cpu) != (s.load.IsSet(cpu) || s.service.IsSet(cpu)) {
			t.Errorf("processor %d: load %v, service %v, of this process %v", cpu, s.load.IsSet(cpu), s.service.IsSet(cpu), all.IsSet(cpu))
		}
	}

	// A process pinned to the services' half runs there.
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := s.pinService(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(cmd.Process.Pid, &got); err != nil {
		t.Fatal(err)
	}
	if got != s.service {
		t.Errorf("after pinService: processors %s, want %s", cpuList(&got), cpuList(&s.service))
	}
	// This process on the load's half, and back on all of them.
	procs := runtime.GOMAXPROCS(0)
	restore, err := s.pinSelf()
	if err != nil {
		t.Fatal(err)
	}
	var self unix.CPUSet
	if err := unix.SchedGetaffinity(0, &self); err != nil || self != s.load || runtime.GOMAXPROCS(0) != s.load.Count() {
		t.Errorf("after pinSelf: processors %s (%v), GOMAXPROCS %d; want %s, %d", cpuList(&self), err, runtime.GOMAXPROCS(0), cpuList(&s.load), s.load.Count())
	}
	restore()
	if err := unix.SchedGetaffinity(0, &self); err != nil || self != all || runtime.GOMAXPROCS(0) != procs {
		t.Errorf("after restore: processors %s (%v), GOMAXPROCS %d; want %s, %d", cpuList(&self), err, runtime.GOMAXPROCS(0), cpuList(&all), procs)
	}

	if err := pin(1<<22+1, &s.service); err == nil { // above Linux's pid_max
		t.Error("pin of no process: no error")
	}
}
