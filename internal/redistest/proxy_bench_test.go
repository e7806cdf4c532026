package redistest_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// BenchmarkProxy measures the round trips of small messages on an echo
// server, one connection per goroutine as a client pool has: direct, and
// through the proxy without latency and with 1µs each way (its own cost:
// the wait for bytes due at once). ns/op is per round trip over all the
// connections; compare the three with benchstat.
func BenchmarkProxy(b *testing.B) {
	for _, bc := range []struct {
		name    string
		proxy   bool
		latency time.Duration
	}{
		{"direct", false, 0},
		{"proxy", true, 0},
		{"proxy-1us", true, time.Microsecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEcho(b)
			addr := e.ln.Addr().String()
			if bc.proxy {
				p := redistest.ProxyTo(b, addr)
				p.SetLatency(bc.latency, bc.latency)
				addr = p.Addr()
			}
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.Close()
				msg := []byte("*1\r\n$4\r\nPING\r\n")
				buf := make([]byte, len(msg))
				for pb.Next() {
					if _, err := c.Write(msg); err != nil {
						b.Error(err)
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkProxyLatency measures one connection's round trip through the
// proxy with latency each way: ns/op less twice the latency is what the
// proxy adds beyond it (timer wake-ups, copying, scheduling).
func BenchmarkProxyLatency(b *testing.B) {
	for _, each := range []time.Duration{100 * time.Microsecond, 500 * time.Microsecond, 2500 * time.Microsecond} {
		b.Run(each.String(), func(b *testing.B) {
			e := newEcho(b)
			p := redistest.ProxyTo(b, e.ln.Addr().String())
			p.SetLatency(each, each)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg := []byte("*1\r\n$4\r\nPING\r\n")
			buf := make([]byte, len(msg))
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
