package redistest_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestSentinel(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := redistest.Sentinel(t)
	t.Logf("StartSentinel took %v", time.Since(start))
	if n := len(s.SentinelAddrs()); n != 3 {
		t.Fatalf("len(SentinelAddrs()) = %d, want 3", n)
	}
	nodes := s.Nodes()
	if len(nodes) != 3 {
		t.Fatalf("len(Nodes()) = %d, want 3", len(nodes))
	}
	addrs := make([]string, len(nodes))
	for i, p := range nodes {
		addrs[i] = p.Addr()
	}
	first, err := s.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if first != addrs[0] {
		t.Fatalf("MasterAddr() = %s, want the first node %s", first, addrs[0])
	}

	rdb := redistest.FailoverClient(t, s)
	ctx := t.Context()
	const key, want = "redistest:sentinel", "v1"
	// SET and WAIT on one connection: both replicas hold the key before the
	// master dies.
	var wait *redis.Cmd
	if _, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, key, want, 0)
		wait = pipe.Do(ctx, "WAIT", 2, 5000)
		return nil
	}); err != nil {
		t.Fatalf("SET, WAIT: %v", err)
	}
	if n, err := wait.Int64(); err != nil || n != 2 {
		t.Fatalf("WAIT 2 5000 = %d, %v; want 2 replicas", n, err)
	}

	m, err := s.Master()
	if err != nil {
		t.Fatal(err)
	}
	if m != nodes[0] {
		t.Fatalf("Master() = %s, want %s", m.Addr(), first)
	}
	// With no failover under way, WaitFailover gives up and shows the
	// sentinels' logs.
	if _, err := s.WaitFailover(first, 0); err == nil || strings.Count(err.Error(), "'s log ends with:") != 3 {
		t.Fatalf("WaitFailover with the master alive = %v; want an error with the end of each of the 3 sentinels' logs", err)
	}
	killed := time.Now()
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	second, err := s.WaitFailover(first, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover after SIGKILL took %v", time.Since(killed))
	if second == first || !slices.Contains(addrs[1:], second) {
		t.Fatalf("WaitFailover() = %s, want one of the replicas %v", second, addrs[1:])
	}
	getEventually(t, rdb, key, want, nil)

	manual := time.Now()
	if err := s.Failover(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Failover() returned after %v", time.Since(manual))
	third, err := s.WaitFailover(second, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manual failover took %v", time.Since(manual))
	if third == first || third == second || !slices.Contains(addrs, third) {
		t.Fatalf("WaitFailover() after Failover = %s, want the replica that is neither %s nor %s", third, first, second)
	}
	getEventually(t, rdb, key, want, nil)
}

// getEventually retries GET key through rdb until it answers, for at most
// 10 s, calling retry (if not nil) after each failure, and checks the
// answer is want.
func getEventually(t *testing.T, rdb redis.Cmdable, key, want string, retry func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := rdb.Get(t.Context(), key).Result()
		if err == nil || errors.Is(err, redis.Nil) {
			if got != want || err != nil {
				t.Fatalf("GET %s = %q, %v; want %q", key, got, err, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v after 10s", key, err)
		}
		if retry != nil {
			retry()
		}
		time.Sleep(50 * time.Millisecond) // polling a failover's end
	}
}

// TestSentinelTilt: sentinels whose processes were starved for longer than
// 2 s (here frozen) enter TILT, in which they fail nothing over; they leave
// it after tiltPeriod rather than Sentinel's 30 s, so that a machine that
// stalled does not fail a test that waits for a failover.
func TestSentinelTilt(t *testing.T) {
	t.Parallel()
	s := redistest.Sentinel(t)
	for _, p := range s.Sentinels() {
		if err := p.Freeze(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // the stall itself
	for _, p := range s.Sentinels() {
		if err := p.Thaw(); err != nil {
			t.Fatal(err)
		}
	}
	// Each sentinel's timer (10 a second) finds the stall and tilts. Its log
	// keeps "+tilt" after it has left TILT again, which a starved test
	// polling INFO could miss.
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range s.Sentinels() {
		for {
			log, err := os.ReadFile(p.LogPath())
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(log, []byte("+tilt")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s logged no +tilt 10s after a 2.5s stall", p.Addr())
			}
			time.Sleep(20 * time.Millisecond) // polling the sentinel's timer
		}
	}
	m, err := s.Master()
	if err != nil {
		t.Fatal(err)
	}
	old := m.Addr()
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.WaitFailover(old, 15*time.Second); err != nil {
		t.Fatalf("failover after the sentinels tilted: %v", err)
	}
	t.Logf("failed over %v after the kill, the sentinels tilted just before", time.Since(start).Round(time.Millisecond))
}

func TestSentinelStop(t *testing.T) {
	t.Parallel()
	s := redistest.Sentinel(t)
	var pids []int
	for _, p := range s.Nodes() {
		if !alive(p.Pid()) {
			t.Errorf("node %s pid %d is not alive", p.Addr(), p.Pid())
		}
		pids = append(pids, p.Pid())
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d is alive after Stop", pid)
		}
	}
	for _, addr := range s.SentinelAddrs() {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("sentinel %s accepts connections after Stop", addr)
		}
	}
	if addr, err := s.MasterAddr(); err == nil {
		t.Errorf("MasterAddr() after Stop = %s, want an error", addr)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop() = %v, want nil", err)
	}
}
