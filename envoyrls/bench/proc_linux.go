//go:build linux

package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc/PID/stat's CPU times: USER_HZ, 100 on
// Linux everywhere.
const clockTick = 10 * time.Millisecond

// procCPU returns the CPU time (user and system) process pid has used, from
// /proc/PID/stat, in clockTick steps; an error where there is no /proc.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return statCPU(string(b))
}

// statCPU returns utime plus stime from the text of /proc/PID/stat: the
// 14th and 15th fields, counted after the command's closing parenthesis
// (a command may hold spaces and parentheses).
func statCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: /proc stat %q: no command", stat)
	}
	f := strings.Fields(stat[i+1:]) // from the 3rd field, state
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc stat %q: %d fields after the command", stat, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime: fields 14 and 15
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc stat %q: %w", stat, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// selfCPU returns the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
