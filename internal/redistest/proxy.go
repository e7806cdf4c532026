package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyDialTimeout bounds the proxy's dial to its target.
const proxyDialTimeout = 5 * time.Second

// proxyQueue is how many chunks one direction of a connection holds while
// their latency runs; a reader waits when it is full.
const proxyQueue = 256

// Proxy is a TCP proxy on a loopback port in front of a server, for fault
// tests: clients connect to Addr and the proxy forwards each connection to
// its target. At run time it can delay the bytes in either direction, drop
// every connection, black-hole the traffic (keep the sockets open and
// forward nothing: half-open connections as a network partition leaves
// them), refuse new connections, and close the connection of chosen
// requests (CutOn).
//
// Create one with StartProxy (or ProxyTo in a test) and stop it with Close.
// Its methods are safe for concurrent use. It owns one goroutine to accept
// and four per connection, and Close waits for all of them.
type Proxy struct {
	target string
	addr   string // 127.0.0.1:port, the same for the proxy's whole life

	toServer, toClient atomic.Int64 // latency in ns
	blackhole          atomic.Bool
	accepted           atomic.Int64

	cut atomic.Pointer[cut] // see CutOn; nil: none

	ctl sync.Mutex // serializes SetRefuse, SetBlackhole and Close

	mu     sync.Mutex // protects the fields below
	ln     net.Listener
	conns  map[*pipe]struct{}
	closed bool

	wg sync.WaitGroup // the accept loop and every connection's goroutines
}

// pipe is one client connection and its connection to the target.
type pipe struct {
	p      *Proxy
	client net.Conn
	held   atomic.Bool   // black-holed: nothing is forwarded any more
	done   chan struct{} // closed by close

	mu       sync.Mutex // protects server, sleepers and closed
	server   net.Conn   // nil until dialled, and for a black-holed connection
	sleepers []sleeper  // the writers', closed with the connection
	closed   bool
}

// cut is what CutOn set: the connections to close, before they forward it,
// of the next n client chunks that hold match.
type cut struct {
	match []byte
	n     atomic.Int64
}

// chunk is bytes read from one side, due on the other side at due.
type chunk struct {
	b   []byte
	due time.Time
}

// StartProxy starts a proxy on a free port of 127.0.0.1 that forwards to
// target, a loopback address. The caller must call Close.
func StartProxy(target string) (*Proxy, error) {
	if err := CheckLoopback(target); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redistest: proxy: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[*pipe]struct{}{}}
	p.wg.Go(func() { p.serve(ln) })
	return p, nil
}

// ProxyTo returns a proxy in front of the server at addr for tb, closed at
// cleanup.
func ProxyTo(tb testing.TB, addr string) *Proxy {
	tb.Helper()
	p, err := StartProxy(addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// Addr returns the address clients connect to, "127.0.0.1:port". It does
// not change when the proxy refuses connections for a while.
func (p *Proxy) Addr() string { return p.addr }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// SetLatency delays every byte read from then on by toServer on its way from
// a client to the target and by toClient on its way back. Bytes keep their
// order; 0 forwards at once. A delay is never shorter than asked, and on
// Linux longer by the wake-up of a timerfd, tens of microseconds (see
// newSleeper); BenchmarkProxyLatency measures it.
func (p *Proxy) SetLatency(toServer, toClient time.Duration) {
	p.toServer.Store(int64(max(toServer, 0)))
	p.toClient.Store(int64(max(toClient, 0)))
}

// DropAll closes every open connection, both its sides, as a server or a
// middlebox resetting them would. New connections are accepted as before
// (see SetRefuse).
func (p *Proxy) DropAll() {
	p.mu.Lock()
	all := make([]*pipe, 0, len(p.conns))
	for c := range p.conns {
		all = append(all, c)
	}
	p.mu.Unlock()
	for _, c := range all {
		c.close()
	}
}

// CutOn closes the connection of each of the next n requests that a client
// sends holding match, both its sides, before the request reaches the
// server: the client reads EOF where it waits for the reply, as from a
// pooled connection that a server or a middlebox closed, and the server
// never sees the request. A request is what one read from the client
// brings (a command or a pipeline, as small ones arrive whole on loopback).
// A later call replaces the earlier one; n = 0 ends it.
func (p *Proxy) CutOn(match []byte, n int) {
	if n <= 0 {
		p.cut.Store(nil)
		return
	}
	c := &cut{match: slices.Clone(match)}
	c.n.Store(int64(n))
	p.cut.Store(c)
}

// cuts reports whether the client chunk b is one that CutOn closes the
// connection of, counting it if so.
func (p *Proxy) cuts(b []byte) bool {
	c := p.cut.Load()
	return c != nil && bytes.Contains(b, c.match) && c.n.Add(-1) >= 0
}

// SetBlackhole with on makes the proxy a black hole: it keeps every open
// connection and accepts new ones, reads what clients send and discards it,
// and forwards nothing either way, so that clients see half-open sockets
// that never answer. With on false it forwards again; the connections held
// meanwhile are closed then, as a partition that heals finds them dead, so
// that no client reads a reply meant for a request of before.
func (p *Proxy) SetBlackhole(on bool) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	p.mu.Lock()
	p.blackhole.Store(on)
	var held []*pipe
	for c := range p.conns {
		if on {
			c.held.Store(true)
		} else if c.held.Load() {
			held = append(held, c)
		}
	}
	p.mu.Unlock()
	for _, c := range held {
		c.close()
	}
}

// SetRefuse with on closes the listening socket, so that new connections
// are refused (ECONNREFUSED), and leaves the open ones alone. With on false
// it listens again on the same address.
func (p *Proxy) SetRefuse(on bool) error {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	p.mu.Lock()
	ln, closed := p.ln, p.closed
	if on {
		p.ln = nil
	}
	p.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("redistest: proxy %s: %w", p.addr, net.ErrClosed)
	case on && ln != nil:
		if err := ln.Close(); err != nil {
			return fmt.Errorf("redistest: proxy %s: %w", p.addr, err)
		}
	case !on && ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("redistest: proxy %s: listen again: %w", p.addr, err)
		}
		p.mu.Lock()
		p.ln = ln
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(ln) })
	}
	return nil
}

// Conns returns the number of connections open now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted returns the number of connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end. Closing twice does nothing.
func (p *Proxy) Close() error {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	var err error
	if ln != nil {
		if cerr := ln.Close(); cerr != nil {
			err = fmt.Errorf("redistest: proxy %s: %w", p.addr, cerr)
		}
	}
	p.DropAll()
	p.wg.Wait()
	return err
}

// serve accepts connections on ln until it is closed.
func (p *Proxy) serve(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed (SetRefuse, Close), or broken: either way no more
		}
		p.accepted.Add(1)
		c := &pipe{p: p, client: conn, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			conn.Close()
			return
		}
		p.conns[c] = struct{}{}
		c.held.Store(p.blackhole.Load())
		p.wg.Go(func() { c.run() })
		p.mu.Unlock()
	}
}

// run dials the target and forwards both ways until the connection closes.
// A connection accepted while the proxy is a black hole is not dialled: what
// its client sends is read and dropped.
func (c *pipe) run() {
	defer c.close()
	if c.held.Load() {
		c.drain()
		return
	}
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.Dial("tcp", c.p.target)
	if err != nil {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		server.Close()
		return
	}
	c.server = server
	toServer, toClient := newSleeper(), newSleeper()
	c.sleepers = []sleeper{toServer, toClient}
	c.mu.Unlock()
	up := make(chan chunk, proxyQueue)
	down := make(chan chunk, proxyQueue)
	c.p.wg.Go(func() { c.write(server, up, toServer) })
	c.p.wg.Go(func() { c.write(c.client, down, toClient) })
	c.p.wg.Go(func() { c.read(server, down, &c.p.toClient, false) })
	c.read(c.client, up, &c.p.toServer, true)
}

// drain reads from the client and drops it until the connection closes.
func (c *pipe) drain() {
	buf := make([]byte, 4096)
	for {
		if _, err := c.client.Read(buf); err != nil {
			return
		}
	}
}

// read reads src into chunks for out, each due after the latency at the
// time it was read, until src fails or the connection closes. A held
// connection's bytes are dropped; a client's chunk that CutOn names closes
// the connection.
func (c *pipe) read(src net.Conn, out chan<- chunk, latency *atomic.Int64, client bool) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && client && c.p.cuts(buf[:n]) {
			return
		}
		if n > 0 && !c.held.Load() {
			ck := chunk{b: slices.Clone(buf[:n]), due: time.Now().Add(time.Duration(latency.Load()))}
			select {
			case out <- ck:
			case <-c.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write writes the chunks of in to dst when they are due, waiting on s,
// until the connection closes. A held connection's chunks are dropped.
func (c *pipe) write(dst net.Conn, in <-chan chunk, s sleeper) {
	defer c.close()
	for {
		var ck chunk
		select {
		case ck = <-in:
		case <-c.done:
			return
		}
		if !s.sleep(ck.due, c.done) {
			return
		}
		if c.held.Load() {
			continue
		}
		if _, err := dst.Write(ck.b); err != nil {
			return
		}
	}
}

// close closes both sides of the connection and forgets it. It may be
// called many times, from any goroutine.
func (c *pipe) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	server, sleepers := c.server, c.sleepers
	c.mu.Unlock()
	close(c.done)
	for _, s := range sleepers {
		s.close()
	}
	c.client.Close()
	if server != nil {
		server.Close()
	}
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}
