package redistest_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// needBinary skips tb without the named binary on PATH, or fails it when
// redistest.Required.
func needBinary(tb testing.TB, name string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if redistest.Required() {
			tb.Fatal(err)
		}
		tb.Skip(err)
	}
}

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}

func TestServerKillRestart(t *testing.T) {
	t.Parallel()
	p := redistest.Server(t)
	if !p.Owned() {
		t.Skip("REDIS_ADDR names a server this test cannot kill")
	}
	if got := p.Addr(); !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("Addr() = %q, want 127.0.0.1:port", got)
	}
	rdb := redistest.Client(t, p)
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET k v: %v", err)
	}

	pid := p.Pid()
	if !alive(pid) {
		t.Fatalf("pid %d is not alive before Kill", pid)
	}
	if err := p.Kill(); err != nil {
		t.Fatalf("Kill() = %v", err)
	}
	if alive(pid) {
		t.Errorf("pid %d is alive after Kill", pid)
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Errorf("dial %s after Kill: got a connection, want refused", p.Addr())
	}
	if err := p.Kill(); err != nil {
		t.Errorf("second Kill() = %v, want nil", err)
	}

	if err := p.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}
	if !alive(p.Pid()) {
		t.Errorf("pid %d is not alive after Restart", p.Pid())
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if got, err := rdb.Get(ctx, "k").Result(); err != redis.Nil {
		t.Errorf("GET k after Restart = %q, %v; want redis.Nil (no persistence)", got, err)
	}
}

func TestRestartRunning(t *testing.T) {
	t.Parallel()
	p := redistest.Server(t)
	if !p.Owned() {
		t.Skip("REDIS_ADDR names a server this test cannot restart")
	}
	pid := p.Pid()
	if err := p.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}
	if alive(pid) {
		t.Errorf("old pid %d is alive after Restart", pid)
	}
	if err := redistest.Client(t, p).Ping(t.Context()).Err(); err != nil {
		t.Errorf("PING after Restart: %v", err)
	}
}

func TestStop(t *testing.T) {
	t.Parallel()
	needBinary(t, "redis-server")
	p, err := redistest.Start(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := p.Pid(), p.Dir()
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if alive(pid) {
		t.Errorf("pid %d is alive after Stop", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(%s) after Stop = %v, want not exist", dir, err)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop() = %v, want nil", err)
	}
	if err := p.Kill(); !errors.Is(err, redistest.ErrStopped) {
		t.Errorf("Kill() after Stop = %v, want ErrStopped", err)
	}
	if err := p.Restart(); !errors.Is(err, redistest.ErrStopped) {
		t.Errorf("Restart() after Stop = %v, want ErrStopped", err)
	}
}

func TestStartOptions(t *testing.T) {
	t.Parallel()
	needBinary(t, "redis-server")
	dir := t.TempDir()
	p, err := redistest.Start(redistest.Options{Dir: dir, Args: []string{"--maxmemory", "12345678"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	rdb := redistest.Client(t, p)
	got, err := rdb.ConfigGet(t.Context(), "maxmemory").Result()
	if err != nil || got["maxmemory"] != "12345678" {
		t.Errorf("CONFIG GET maxmemory = %v, %v; want 12345678", got, err)
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "redis.log")); err != nil {
		t.Errorf("a Dir given in Options is kept by Stop with its log: %v", err)
	}
}

// TestStartPortTaken checks that a failed start reports the server's log.
func TestStartPortTaken(t *testing.T) {
	t.Parallel()
	p := redistest.Server(t)
	if !p.Owned() {
		t.Skip("REDIS_ADDR is set")
	}
	_, port, _ := strings.Cut(p.Addr(), ":")
	n, _ := strconv.Atoi(port)
	q, err := redistest.Start(redistest.Options{Port: n})
	if err == nil {
		q.Stop()
		t.Fatalf("Start on taken port %d: got no error", n)
	}
	if !strings.Contains(err.Error(), "Address already in use") {
		t.Errorf("Start on taken port %d = %v, want the log saying Address already in use", n, err)
	}
}

func TestExternal(t *testing.T) {
	p := redistest.Server(t)
	t.Setenv(redistest.EnvAddr, p.Addr())
	q := redistest.Server(t)
	if q.Owned() || q.Addr() != p.Addr() || q.Pid() != 0 {
		t.Errorf("Server with REDIS_ADDR = (owned %v, %s, pid %d), want (false, %s, 0)", q.Owned(), q.Addr(), q.Pid(), p.Addr())
	}
	if err := q.Kill(); !errors.Is(err, redistest.ErrNotOwned) {
		t.Errorf("Kill() = %v, want ErrNotOwned", err)
	}
	if err := q.Restart(); !errors.Is(err, redistest.ErrNotOwned) {
		t.Errorf("Restart() = %v, want ErrNotOwned", err)
	}
	if err := q.Stop(); err != nil {
		t.Errorf("Stop() = %v, want nil", err)
	}
	if err := redistest.Client(t, q).Ping(t.Context()).Err(); err != nil {
		t.Errorf("PING through REDIS_ADDR: %v", err)
	}
}

func BenchmarkStart(b *testing.B) {
	needBinary(b, "redis-server")
	for b.Loop() {
		p, err := redistest.Start(redistest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Stop(); err != nil {
			b.Fatal(err)
		}
	}
}
