// Package redistest starts real redis-server processes on loopback ports for
// integration tests and benchmarks, and stops them by pid.
//
// It has two layers. Start, StartCluster and StartSentinel manage processes;
// they take no testing.TB and use no Redis client (proc.go, cluster.go and
// sentinel.go import neither), so a command-line tool can use them to
// start, crash (Kill) and restart a server. Server, Cluster, Sentinel,
// Client, ClusterClient and FailoverClient wrap them for tests: they skip when Redis is not installed
// (fail when HYBRID_REQUIRE_REDIS=1), honour REDIS_ADDR and
// REDIS_CLUSTER_ADDRS, and clean up with tb.Cleanup.
//
// Every test gets its own server, so there is nothing to flush. Measured on
// 2 cores (AMD EPYC, Redis 7.0): starting a server takes about 17 ms (13 to
// 33 ms) and stopping it about 2 ms; a 3-node cluster takes about 2.1 s
// (sometimes 3.1 s), nearly all of it redis-cli --cluster create waiting in
// one-second steps for the nodes to agree. BenchmarkStart and
// BenchmarkStartCluster measure them again.
//
// Only loopback addresses are ever connected to.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// readyTimeout bounds the wait for a started server to answer.
	readyTimeout = 10 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 5 * time.Millisecond
	// probeTimeout bounds one readiness probe.
	probeTimeout = 500 * time.Millisecond
	// startAttempts is how many free ports Start tries when another process
	// takes the port between the probe and the bind.
	startAttempts = 5
	// logTailBytes is how much of the server log an error quotes.
	logTailBytes = 2048
	// logName is the server log, in the server's directory.
	logName = "redis.log"
)

// Sentinel errors.
var (
	// ErrNotOwned is returned by Kill and Restart on a Proc that points at a
	// server this process did not start (REDIS_ADDR, REDIS_CLUSTER_ADDRS).
	ErrNotOwned = errors.New("redistest: server not started by this process")
	// ErrStopped is returned by Kill and Restart after Stop.
	ErrStopped = errors.New("redistest: server stopped")

	// errAddrInUse marks a start that failed because the port was taken.
	errAddrInUse = errors.New("address already in use")
	// errExited marks a server that exited before it answered.
	errExited = errors.New("redis-server exited")
)

// Options configures Start. A zero field means its default.
type Options struct {
	Port int      // 0 means a free loopback port
	Dir  string   // "" means a fresh temporary directory, removed by Stop
	Args []string // extra redis-server arguments, e.g. "--maxmemory", "10mb"

	auth []string // AUTH arguments the readiness probe sends first (StartAuth)
}

// Proc is a redis-server process listening on 127.0.0.1, or a server given by
// address that this process does not own (see Owned). Create one with Start;
// the zero value is not usable. Its methods are safe for concurrent use; Kill,
// Restart and Stop run one at a time.
type Proc struct {
	addr  string
	owned bool
	bin   string   // redis-server binary
	args  []string // redis-server arguments
	dir   string
	rmDir bool     // Stop removes dir
	auth  []string // AUTH arguments sent before each readiness probe, nil for none

	pid atomic.Int64 // last process started, alive or not

	mu      sync.Mutex // serializes Kill, Restart and Stop, and protects the fields below
	cmd     *exec.Cmd  // running process, nil if none
	exited  chan struct{}
	stopped bool
}

// Start starts redis-server on 127.0.0.1 without persistence and waits until
// it answers. It retries on other ports if a port chosen by Start turns out
// to be taken. The caller must call Stop.
func Start(opts Options) (*Proc, error) {
	return start(opts, freePort)
}

// start is Start with the function that picks a free port.
func start(opts Options, pick func() (int, error)) (*Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	dir, rmDir := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "redistest-"); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		rmDir = true
	} else {
		if dir, err = filepath.Abs(dir); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
	}
	attempts := startAttempts
	if opts.Port != 0 {
		attempts = 1
	}
	for range attempts {
		port := opts.Port
		if port == 0 {
			if port, err = pick(); err != nil {
				break
			}
		}
		p := &Proc{
			addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			owned: true,
			bin:   bin,
			dir:   dir,
			rmDir: rmDir,
			auth:  opts.auth,
		}
		p.args = append([]string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--protected-mode", "yes",
			"--save", "",
			"--appendonly", "no",
			"--daemonize", "no",
			"--dir", dir,
			"--logfile", "",
		}, opts.Args...)
		if err = p.launch(); err == nil {
			return p, nil
		}
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if rmDir {
		os.RemoveAll(dir)
	}
	return nil, err
}

// external returns a Proc for a server this process does not own.
func external(addr string) *Proc {
	return &Proc{addr: addr}
}

// Addr returns the server's address, "127.0.0.1:port" for a server started
// here.
func (p *Proc) Addr() string { return p.addr }

// Pid returns the pid of the last redis-server process started for p, alive
// or not, or 0 if p is not owned.
func (p *Proc) Pid() int { return int(p.pid.Load()) }

// Owned reports whether p runs a process started here. Kill and Restart need
// one; tests that use them should skip when Owned is false.
func (p *Proc) Owned() bool { return p.owned }

// Dir returns the server's working directory, which holds its log, or "" if
// p is not owned.
func (p *Proc) Dir() string { return p.dir }

// LogPath returns the file the server logs to, across restarts, or "" if p
// is not owned.
func (p *Proc) LogPath() string {
	if p.dir == "" {
		return ""
	}
	return filepath.Join(p.dir, logName)
}

// Kill sends SIGKILL to the server and waits for it to exit, like a crash.
// Killing a server that is not running does nothing.
func (p *Proc) Kill() error {
	if !p.owned {
		return fmt.Errorf("redistest: kill %s: %w", p.addr, ErrNotOwned)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return fmt.Errorf("redistest: kill %s: %w", p.addr, ErrStopped)
	}
	return p.killLocked()
}

// Freeze stops the server's process (SIGSTOP) without ending it: it keeps
// its connections and answers nothing, as a server stalled by its host, and
// a replica frozen so misses what its master writes meanwhile. Thaw lets it
// go on. Linux only.
func (p *Proc) Freeze() error { return p.signal("freeze", true) }

// Thaw lets a frozen server go on (SIGCONT).
func (p *Proc) Thaw() error { return p.signal("thaw", false) }

// signal sends the server the freeze signal, or the one that lets it go on.
func (p *Proc) signal(what string, stop bool) error {
	if !p.owned {
		return fmt.Errorf("redistest: %s %s: %w", what, p.addr, ErrNotOwned)
	}
	sigStop, sigCont, ok := freezeSignals()
	if !ok {
		return fmt.Errorf("redistest: %s %s: not supported on this system", what, p.addr)
	}
	sig := sigCont
	if stop {
		sig = sigStop
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.cmd == nil {
		return fmt.Errorf("redistest: %s %s: %w", what, p.addr, ErrStopped)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %s %s: %w", what, p.addr, err)
	}
	return nil
}

// Restart starts the server again on the same port and waits until it
// answers, killing it first if it is running. The new server holds no keys;
// a cluster node keeps its nodes.conf, so it comes back as the same node with
// the same slots, and the cluster is ok again about 2 s later.
func (p *Proc) Restart() error {
	if !p.owned {
		return fmt.Errorf("redistest: restart %s: %w", p.addr, ErrNotOwned)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return fmt.Errorf("redistest: restart %s: %w", p.addr, ErrStopped)
	}
	if err := p.killLocked(); err != nil {
		return err
	}
	var err error
	for i := range startAttempts {
		if err = p.launch(); !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(time.Duration(i+1) * 50 * time.Millisecond)
	}
	return err
}

// Stop kills the server with SIGKILL, waits for it to exit and removes the
// directory Start created. The server keeps no data, so a graceful shutdown
// would buy nothing and cost redis-server's 100 ms shutdown tick. Stopping
// twice, or stopping a Proc that is not owned, does nothing.
func (p *Proc) Stop() error {
	if !p.owned {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	p.stopped = true
	err := p.killLocked()
	if p.rmDir {
		if rerr := os.RemoveAll(p.dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("redistest: stop %s: %w", p.addr, rerr))
		}
	}
	return err
}

// killLocked kills and reaps the running process, if any. p.mu must be held.
func (p *Proc) killLocked() error {
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.exited:
	default:
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("redistest: kill %s: %w", p.addr, err)
		}
		<-p.exited
	}
	p.cmd, p.exited = nil, nil
	return nil
}

// launch starts the process and waits until it answers. On failure the
// process is killed and reaped, and the error quotes the end of its log.
// p.mu must be held, or p not yet shared.
func (p *Proc) launch() error {
	logPath := filepath.Join(p.dir, logName)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	from, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		logf.Close()
		return fmt.Errorf("redistest: %w", err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("redistest: start redis-server on %s: %w", p.addr, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	p.pid.Store(int64(cmd.Process.Pid))

	if err := waitReady(p.addr, p.auth, cmd.Process.Pid, exited); err != nil {
		p.killLocked()
		tail := logTail(logPath, from)
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return fmt.Errorf("redistest: start redis-server on %s: %w; log %s ends with:\n%s", p.addr, err, logPath, tail)
	}
	return nil
}

// waitReady polls addr until the server with the given pid answers INFO, the
// process exits, or readyTimeout passes. Checking the pid makes sure the
// answer does not come from another server that took the port. auth, if not
// nil, is sent as an AUTH command before each probe.
func waitReady(addr string, auth []string, pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	want := "process_id:" + strconv.Itoa(pid) + "\r\n"
	for {
		info, err := authCommand(addr, probeTimeout, auth, "INFO", "server")
		if err == nil {
			if strings.Contains(info, want) {
				return nil
			}
			err = fmt.Errorf("%s is answered by another server", addr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer after %v: %w", readyTimeout, err)
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-exited:
			t.Stop()
			return errExited
		case <-t.C:
		}
	}
}

// logTail returns the end of the log written since offset from.
func logTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-from > logTailBytes {
		from = fi.Size() - logTailBytes
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return "(" + err.Error() + ")"
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.TrimRight(string(b), "\n")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	return port, nil
}

// portFree reports whether port on 127.0.0.1 can be listened on.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// command sends one command to the server at the loopback address addr and
// returns its reply, which must be a simple string, an integer or a bulk
// string. An error reply is returned as an error.
func command(addr string, timeout time.Duration, args ...string) (string, error) {
	return authCommand(addr, timeout, nil, args...)
}

// authCommand is command on a connection that first sends AUTH with the
// arguments auth (a password, or a user and a password), unless auth is nil.
func authCommand(addr string, timeout time.Duration, auth []string, args ...string) (string, error) {
	if err := CheckLoopback(addr); err != nil {
		return "", err
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	if auth != nil {
		writeCommand(&b, append([]string{"AUTH"}, auth...))
	}
	writeCommand(&b, args)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	if auth != nil {
		if _, err := readReply(r, "AUTH"); err != nil {
			return "", fmt.Errorf("AUTH: %w", err)
		}
	}
	return readReply(r, args[0])
}

// writeCommand appends args to b as a RESP array of bulk strings.
func writeCommand(b *strings.Builder, args []string) {
	fmt.Fprintf(b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(b, "$%d\r\n%s\r\n", len(a), a)
	}
}

// readReply reads the reply to the command name from r: a simple string, an
// integer or a bulk string. An error reply is returned as an error.
func readReply(r *bufio.Reader, name string) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply to %s", name)
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q to %s", line, name)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q to %s", line, name)
}
