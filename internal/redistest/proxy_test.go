package redistest_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The proxy tests run it in front of an echo server on a loopback port,
// which counts what reaches it. Real time is unavoidable here (the proxy
// moves bytes between real sockets): latency is checked as a lower bound,
// and the waits are on sockets with deadlines.

// echo is a TCP server on 127.0.0.1 that writes back what it reads and
// counts the bytes it received.
type echo struct {
	ln       net.Listener
	received atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex // protects conns
	conns []net.Conn
}

// newEcho starts an echo server, stopped at cleanup.
func newEcho(t testing.TB) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					e.received.Add(int64(n))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

// dial connects to addr, closed at cleanup.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg to c and reads it back, within timeout, and returns
// how long it took.
func roundTrip(c net.Conn, msg string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := io.WriteString(c, msg); err != nil {
		return 0, err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, err
	}
	if string(buf) != msg {
		return 0, errors.New("echoed " + string(buf) + ", want " + msg)
	}
	return time.Since(start), nil
}

// wantSilent checks that nothing comes back on c within d.
func wantSilent(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%s: Read = %d bytes, %v; want a timeout with nothing read", what, n, err)
	}
}

// wantClosed checks that c is closed by the other side within d.
func wantClosed(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	var ne net.Error
	if n != 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: Read = %d bytes, %v; want the connection closed (EOF or reset)", what, n, err)
	}
}

// waitGoroutines waits at most timeout for the goroutine count to come down
// to n, polling it (nothing signals a goroutine's end), and returns the last
// count.
func waitGoroutines(n int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		<-tick.C
	}
}

// pollConns waits at most timeout for p to hold n connections, polling
// (nothing signals the proxy reading a client's EOF), and returns the last
// count.
func pollConns(p *redistest.Proxy, n int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		got := p.Conns()
		if got == n || time.Now().After(deadline) {
			return got
		}
		<-tick.C
	}
}

// checkGoroutines fails t if the goroutine count does not come back to base.
func checkGoroutines(t *testing.T, base int) {
	t.Helper()
	if n := waitGoroutines(base, 2*time.Second); n > base {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("%d goroutines after Close, %d before:\n%s", n, base, buf.Bytes())
	}
}

func TestProxyForwards(t *testing.T) {
	e := newEcho(t)
	base := runtime.NumGoroutine()
	p, err := redistest.StartProxy(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := redistest.CheckLoopback(p.Addr()); err != nil {
		t.Errorf("Addr() = %q: %v", p.Addr(), err)
	}
	if p.Target() != e.ln.Addr().String() {
		t.Errorf("Target() = %q, want %q", p.Target(), e.ln.Addr())
	}
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	for i, c := range []net.Conn{a, b, a} {
		if _, err := roundTrip(c, "hello", time.Second); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
	}
	if n, acc := p.Conns(), p.Accepted(); n != 2 || acc != 2 {
		t.Errorf("Conns() = %d, Accepted() = %d; want 2, 2", n, acc)
	}
	a.Close()
	// The proxy learns of the close by reading EOF: poll for it.
	if n := pollConns(p, 1, time.Second); n != 1 {
		t.Errorf("Conns() after a client closed = %d, want 1", n)
	}
	// Close with a connection open, twice.
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	wantClosed(t, b, time.Second, "after Close")
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Errorf("dial after Close succeeded, want refused")
	}
	checkGoroutines(t, base)
}

func TestProxyLatency(t *testing.T) {
	e := newEcho(t)
	p := redistest.ProxyTo(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	const up, down = 120 * time.Millisecond, 80 * time.Millisecond
	p.SetLatency(up, down)
	for i := range 3 {
		d, err := roundTrip(c, "ping", 5*time.Second)
		if err != nil {
			t.Fatalf("round trip %d with latency: %v", i, err)
		}
		if d < up+down {
			t.Errorf("round trip %d with latency %v + %v took %v, want at least %v", i, up, down, d, up+down)
		}
	}
	// Both ways at once: several writes in flight keep their order.
	var want bytes.Buffer
	for i := range 20 {
		want.WriteString(string(rune('a' + i)))
	}
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for i := range want.Len() {
		if _, err := c.Write(want.Bytes()[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Errorf("echoed %q, %v; want %q in order", got, err, want.Bytes())
	}
	p.SetLatency(0, 0)
	if d, err := roundTrip(c, "ping", 5*time.Second); err != nil || d >= up+down {
		t.Errorf("round trip without latency = %v, %v; want under %v", d, err, up+down)
	}
}

// twoConns dials p twice and makes a round trip on each connection.
func twoConns(t *testing.T, p *redistest.Proxy) (a, b net.Conn) {
	t.Helper()
	a, b = dial(t, p.Addr()), dial(t, p.Addr())
	for _, c := range []net.Conn{a, b} {
		if _, err := roundTrip(c, "x", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func TestProxyDropAll(t *testing.T) {
	e := newEcho(t)
	p := redistest.ProxyTo(t, e.ln.Addr().String())
	a, b := twoConns(t, p)
	p.DropAll()
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() after DropAll = %d, want 0", n)
	}
	wantClosed(t, a, time.Second, "a after DropAll")
	wantClosed(t, b, time.Second, "b after DropAll")
	// New connections are accepted and forwarded.
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "again", time.Second); err != nil {
		t.Errorf("round trip on a new connection after DropAll: %v", err)
	}
}

// TestProxyCutOn: the connection of a request that holds CutOn's match is
// closed before the request reaches the server, for as many requests as
// it says; other requests, and later ones, go through.
func TestProxyCutOn(t *testing.T) {
	e := newEcho(t)
	p := redistest.ProxyTo(t, e.ln.Addr().String())
	a, b := twoConns(t, p)
	received := e.received.Load()
	p.CutOn([]byte("cut-me"), 1)
	if _, err := roundTrip(b, "pass", time.Second); err != nil {
		t.Errorf("a request without the match: %v, want it forwarded", err)
	}
	received += int64(len("pass"))
	if _, err := io.WriteString(a, "please cut-me now"); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, a, time.Second, "the connection of the matching request")
	if got := e.received.Load(); got != received {
		t.Errorf("the server received %d bytes, want %d: the cut request reached it", got, received)
	}
	if _, err := roundTrip(b, "cut-me again", time.Second); err != nil {
		t.Errorf("a second matching request, after the one CutOn named: %v, want it forwarded", err)
	}
}

func TestProxyBlackhole(t *testing.T) {
	e := newEcho(t)
	p := redistest.ProxyTo(t, e.ln.Addr().String())
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "before", time.Second); err != nil {
		t.Fatal(err)
	}
	received := e.received.Load()

	p.SetBlackhole(true)
	// The open connection stays open: writes succeed, nothing answers.
	if _, err := io.WriteString(old, "lost"); err != nil {
		t.Errorf("write on a black-holed connection: %v, want it accepted", err)
	}
	wantSilent(t, old, 150*time.Millisecond, "open connection in the black hole")
	// A new connection is accepted, and is silent too.
	fresh := dial(t, p.Addr())
	if _, err := io.WriteString(fresh, "lost too"); err != nil {
		t.Errorf("write on a new black-holed connection: %v, want it accepted", err)
	}
	wantSilent(t, fresh, 150*time.Millisecond, "new connection in the black hole")
	if n := p.Conns(); n != 2 {
		t.Errorf("Conns() in the black hole = %d, want 2: the sockets are kept", n)
	}

	p.SetBlackhole(false)
	// The connections held meanwhile are closed; nothing they sent arrived.
	wantClosed(t, old, time.Second, "open connection after the black hole")
	wantClosed(t, fresh, time.Second, "new connection after the black hole")
	if got := e.received.Load(); got != received {
		t.Errorf("the server received %d bytes during the black hole, want none", got-received)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "after", time.Second); err != nil {
		t.Errorf("round trip after the black hole: %v", err)
	}
}

func TestProxyRefuse(t *testing.T) {
	e := newEcho(t)
	p := redistest.ProxyTo(t, e.ln.Addr().String())
	open := dial(t, p.Addr())
	// A round trip first: a connection still in the listener's backlog is
	// reset when the listener closes, and the kept one must be accepted.
	if _, err := roundTrip(open, "first", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.SetRefuse(true); err != nil {
		t.Fatal(err)
	}
	if err := p.SetRefuse(true); err != nil {
		t.Errorf("SetRefuse(true) twice: %v", err)
	}
	_, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial while refusing = %v, want ECONNREFUSED", err)
	}
	if _, err := roundTrip(open, "still", time.Second); err != nil {
		t.Errorf("round trip on a connection opened before: %v, want it kept", err)
	}
	if err := p.SetRefuse(false); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "back", time.Second); err != nil {
		t.Errorf("round trip after refusing: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.SetRefuse(false); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetRefuse after Close = %v, want net.ErrClosed", err)
	}
}

// TestProxyCloseInFlight: Close does not wait for the latency of bytes in
// flight, and leaves no goroutine behind.
func TestProxyCloseInFlight(t *testing.T) {
	e := newEcho(t)
	base := runtime.NumGoroutine()
	p, err := redistest.StartProxy(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour, time.Hour)
	c := dial(t, p.Addr())
	if _, err := io.WriteString(c, "in flight"); err != nil {
		t.Fatal(err)
	}
	dial(t, p.Addr()) // held open in the black hole
	p.SetBlackhole(true)
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v with bytes due in an hour, want it prompt", d)
	}
	checkGoroutines(t, base)
}

func TestProxyRejectsNonLoopback(t *testing.T) {
	if p, err := redistest.StartProxy("10.0.0.1:6379"); err == nil {
		p.Close()
		t.Errorf("StartProxy(10.0.0.1:6379) = nil error, want one")
	}
}

// TestProxyRedis: a go-redis client configured to give up fast goes through
// the proxy to a real redis-server, times out in the black hole and with
// latency above its read timeout, and works again after either.
func TestProxyRedis(t *testing.T) {
	srv := redistest.Server(t)
	p := redistest.ProxyTo(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{
		Addr:                     p.Addr(),
		Dialer:                   redistest.LoopbackDialer(100 * time.Millisecond),
		MaxRetries:               -1,
		DialTimeout:              100 * time.Millisecond,
		ReadTimeout:              100 * time.Millisecond,
		WriteTimeout:             100 * time.Millisecond,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()
	ctx := t.Context()
	ping := func(what string, ok bool) {
		t.Helper()
		err := rdb.Ping(ctx).Err()
		if ok && err != nil {
			t.Errorf("%s: PING = %v, want PONG", what, err)
		}
		var ne net.Error
		if !ok && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s: PING = %v, want a timeout", what, err)
		}
	}
	ping("through the proxy", true)
	p.SetLatency(150*time.Millisecond, 0)
	ping("with 150ms of latency", false)
	p.SetLatency(0, 0)
	ping("without latency", true)
	p.SetBlackhole(true)
	ping("in the black hole", false)
	p.SetBlackhole(false)
	ping("after the black hole", true)
	p.DropAll()
	// The pooled connection was dropped: the first command may fail on it
	// (the client does not retry), the next one dials again.
	_ = rdb.Ping(ctx).Err()
	ping("after DropAll", true)
}
