package global

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The fuzz targets of this file have committed seed corpora in
// testdata/fuzz; `go test` runs those seeds, and `go test -fuzz` explores
// from them.

// decodeKey splits a Redis key made by Key back into the prefix and the user
// key, the way docs/design.md says it can be: the prefix is what lies before
// the first '{' less the ':' before it, the user key what lies between that
// '{' and the final '}'. ok is false for a key that is no bucket key.
func decodeKey(rk string) (prefix, key string, ok bool) {
	i := strings.IndexByte(rk, '{')
	if i < 1 || rk[i-1] != ':' || !strings.HasSuffix(rk[i+1:], "}") {
		return "", "", false
	}
	return rk[:i-1], rk[i+1 : len(rk)-1], true
}

// clusterTag returns what Redis Cluster hashes for the key rk: the bytes
// between the first '{' and the first '}' after it, if there are any, else
// all of rk (as keyHashSlot in Redis's cluster.c).
func clusterTag(rk string) string {
	s := strings.IndexByte(rk, '{')
	if s < 0 {
		return rk
	}
	e := strings.IndexByte(rk[s+1:], '}')
	if e <= 0 {
		return rk
	}
	return rk[s+1 : s+1+e]
}

// FuzzKey checks the key encoding for any two prefixes and user keys: a
// prefix with a brace is refused; otherwise Key is injective (across
// prefixes too) and can be decoded back, no bucket key is a fleet key, the
// fleet keys of two prefixes differ, and the hash tag Redis Cluster sees is
// the user key up to its first '}' (the whole Redis key when that is empty).
func FuzzKey(f *testing.F) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	f.Cleanup(func() { rdb.Close() })
	f.Fuzz(func(t *testing.T, p1, k1, p2, k2 string) {
		l1, err1 := New(rdb, Config{Prefix: p1})
		l2, err2 := New(rdb, Config{Prefix: p2})
		for _, c := range []struct {
			p   string
			err error
		}{{p1, err1}, {p2, err2}} {
			if braces := strings.ContainsAny(c.p, "{}"); braces != (c.err != nil) {
				t.Fatalf("New(prefix %q) = %v; want an error if and only if it holds a brace", c.p, c.err)
			}
		}
		if err1 != nil || err2 != nil {
			return
		}
		ep1, ep2 := effectivePrefix(p1), effectivePrefix(p2)
		rk1, rk2 := l1.Key(k1), l2.Key(k2)
		for _, c := range []struct {
			l      *Limiter
			p, k   string
			rk     string
			others []string
		}{{l1, ep1, k1, rk1, []string{l1.FleetKey(), l2.FleetKey()}}, {l2, ep2, k2, rk2, []string{l1.FleetKey(), l2.FleetKey()}}} {
			p, k, ok := decodeKey(c.rk)
			if !ok || p != c.p || k != c.k {
				t.Fatalf("Key(%q) with prefix %q = %q, decoded as %q, %q, %v", c.k, c.p, c.rk, p, k, ok)
			}
			for _, fk := range c.others {
				if c.rk == fk {
					t.Fatalf("Key(%q) with prefix %q = %q, a fleet key", c.k, c.p, c.rk)
				}
			}
			want := c.k // up to its first '}'
			if i := strings.IndexByte(c.k, '}'); i >= 0 {
				want = c.k[:i]
			}
			if want == "" {
				want = c.rk
			}
			if got := clusterTag(c.rk); got != want {
				t.Fatalf("Key(%q) with prefix %q = %q: Cluster hashes %q, want %q", c.k, c.p, c.rk, got, want)
			}
		}
		if (rk1 == rk2) != (ep1 == ep2 && k1 == k2) {
			t.Fatalf("Key(%q) with prefix %q = %q, Key(%q) with prefix %q = %q: equal %v", k1, ep1, rk1, k2, ep2, rk2, rk1 == rk2)
		}
		if (l1.FleetKey() == l2.FleetKey()) != (ep1 == ep2) {
			t.Fatalf("FleetKey() with prefixes %q and %q: %q and %q", ep1, ep2, l1.FleetKey(), l2.FleetKey())
		}
		if _, _, ok := decodeKey(l1.FleetKey()); ok {
			t.Fatalf("FleetKey() with prefix %q = %q decodes as a bucket key", ep1, l1.FleetKey())
		}
	})
}

// effectivePrefix returns the prefix New uses for Config.Prefix p.
func effectivePrefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	return p
}

// replyValue builds from data a value of the kinds go-redis returns for a
// script reply (integers, strings, nil, nested arrays, and the RESP3 kinds:
// doubles, booleans, big numbers, maps, errors), so that the fuzzer can
// reach every shape. It returns the value and the bytes it did not use.
func replyValue(data []byte, depth int) (any, []byte) {
	if len(data) == 0 {
		return nil, nil
	}
	kind, data := data[0], data[1:]
	take := func(n int) []byte {
		n = min(n, len(data))
		b := data[:n]
		data = data[n:]
		return b
	}
	switch kind % 10 {
	case 0:
		return nil, data
	case 1, 2, 3: // the common case, weighted up
		var b [8]byte
		copy(b[:], take(8))
		return int64(binary.LittleEndian.Uint64(b[:])), data
	case 4: // a small integer, near the bounds that matter
		b := take(1)
		if len(b) == 0 {
			return int64(0), data
		}
		return int64(int8(b[0])) * 1_000_000, data
	case 5:
		n := 0
		if b := take(1); len(b) > 0 {
			n = int(b[0] % 16)
		}
		return string(take(n)), data
	case 6:
		if depth >= 3 {
			return []any{}, data
		}
		n := 0
		if b := take(1); len(b) > 0 {
			n = int(b[0] % 7)
		}
		a := make([]any, n)
		for i := range a {
			a[i], data = replyValue(data, depth+1)
		}
		return a, data
	case 7:
		var b [8]byte
		copy(b[:], take(8))
		return math.Float64frombits(binary.LittleEndian.Uint64(b[:])), data
	case 8:
		b := take(1)
		return len(b) > 0 && b[0]&1 == 1, data
	default:
		b := take(1)
		switch {
		case len(b) == 0:
			return redis.Nil, data
		case b[0]%3 == 0:
			return new(big.Int).SetBytes(take(9)), data
		case b[0]%3 == 1:
			return map[any]any{"granted": int64(b[0])}, data
		}
		return errors.New("ERR " + string(take(8))), data
	}
}

// FuzzParseReply feeds the reply parsers every shape of value: they never
// panic, an error wraps ErrReply and comes with the zero value, and a reply
// they accept is within the bounds they promise (a duplicate only for a call
// with a seq, never with a reset).
func FuzzParseReply(f *testing.F) {
	f.Fuzz(func(t *testing.T, burstTokens uint32, wantTokens uint32, minLive int8, dedup bool, data []byte) {
		burst := int64(burstTokens%1_000_000+1) * 1_000_000
		want := int64(wantTokens) % (burst + 1)
		v, _ := replyValue(data, 0)

		consumed := want / 2
		r, err := parseReply(v, burst, want, consumed, dedup)
		if err != nil {
			if !errors.Is(err, ErrReply) || r != (Reply{}) {
				t.Fatalf("parseReply(%#v) = %+v, %v; want the zero Reply and ErrReply", v, r, err)
			}
		} else if r.Granted < 0 || r.Granted > want || r.Tokens < -MaxDebt || r.Tokens > burst ||
			r.Now.UnixMicro() < 0 || r.Now.UnixMicro() > maxAmount || r.Err != nil ||
			r.Duplicate && (!dedup || r.Reset) || r.Forgiven < 0 || r.Forgiven > consumed {
			t.Fatalf("parseReply(%#v, burst %d, want %d, dedup %v) = %+v: out of bounds", v, burst, want, dedup, r)
		}

		ml := int64(max(minLive, 0))
		b, err := parseFleetReply(v, ml)
		if err != nil {
			if !errors.Is(err, ErrReply) || b != (beatReply{}) {
				t.Fatalf("parseFleetReply(%#v) = %+v, %v; want the zero reply and ErrReply", v, b, err)
			}
		} else if int64(b.live) < ml || b.live > maxLive || b.now.UnixMilli() < 0 || b.now.UnixMilli() > maxAmount ||
			!b.was.IsZero() && (b.was.UnixMilli() <= 0 || b.was.UnixMilli() > maxAmount) ||
			!b.reset.IsZero() && (b.reset.UnixMilli() <= 0 || b.reset.UnixMilli() > maxAmount) {
			t.Fatalf("parseFleetReply(%#v, %d) = %+v: out of bounds", v, ml, b)
		}
	})
}

// FuzzSettleWire answers a settlement round with arbitrary bytes on the
// wire, through a real go-redis client talking to a fake server: Settle and
// Heartbeat never panic and never hang, and every reply either carries an
// error or is within its bounds.
func FuzzSettleWire(f *testing.F) {
	f.Fuzz(settleWire)
}

// wireBatch is the settlement round of FuzzSettleWire: two keys without a
// seq, one with.
var wireBatch = []Settlement{
	{Key: "a", Limit: MicroLimit{Rate: 1_000_000, Burst: 10_000_000}, Consumed: 1_000_000, Want: 2_000_000},
	{Key: "b", Limit: MicroLimit{Rate: 1_000_000, Burst: 10_000_000}, Want: 5_000_000, MinGrant: 1_000_000, Quantum: 1_000_000},
	{Key: "c", Limit: MicroLimit{Rate: 1_000_000, Burst: 10_000_000}, Returned: 1_000_000, Want: 3_000_000, Instance: "fuzz-1", Seq: 7},
}

// wireLimiter returns a Limiter on a fake server whose first answer to a
// script call is raw, and a function that closes its client.
func wireLimiter(t *testing.T, raw []byte) (*Limiter, func()) {
	rdb := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:1", // an IP: go-redis looks a host name up in DNS
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return &wireConn{reply: raw}, nil
		},
		Protocol:                 3,
		MaxRetries:               -1,
		PoolSize:                 1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	l, err := New(rdb, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l, func() { rdb.Close() }
}

// settleWire is one run of FuzzSettleWire: Settle and Heartbeat on a
// server whose first answer to a script call is raw.
func settleWire(t *testing.T, raw []byte) {
	if declaresHuge(raw) {
		return
	}
	l, stop := wireLimiter(t, raw)
	defer stop()
	batch := wireBatch
	replies := make([]Reply, len(batch))
	ctx := context.Background()
	err := l.Settle(ctx, batch, replies)
	for i, r := range replies {
		if r.Err != nil {
			if r.Granted != 0 || r.Tokens != 0 || !r.Now.IsZero() || r.Reset || r.Duplicate {
				t.Fatalf("reply %d = %+v: values with an error", i, r)
			}
			continue
		}
		m := batch[i].Limit
		if r.Granted < 0 || r.Granted > batch[i].Want || r.Tokens < -m.Burst || r.Tokens > m.Burst ||
			r.Duplicate && (batch[i].Seq == 0 || r.Reset) {
			t.Fatalf("reply %d = %+v for %+v: out of bounds (Settle error %v)", i, r, batch[i], err)
		}
	}
	if err != nil && replies[0].Err == nil && replies[1].Err == nil && replies[2].Err == nil {
		t.Fatalf("Settle = %v with no key's error set", err)
	}
	live, now, err := l.Heartbeat(ctx, "fuzz", time.Second)
	if err == nil && (live < 1 || now.UnixMilli() < 0) {
		t.Fatalf("Heartbeat = %d, %v: out of bounds", live, now)
	}
}

// declaresHuge reports whether raw holds a RESP header that declares more
// than 64 elements (array, map, set, push, attribute) or more than 64 KiB
// (bulk string, verbatim string, bulk error). go-redis allocates what a
// header declares before it reads what follows: a reply of "*2147483647"
// ends the process out of memory, and "$2147483647" takes 2 GiB and a
// second. That is the client's limit, not this package's, so the fuzzer is
// kept away from it.
func declaresHuge(raw []byte) bool {
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if len(line) < 2 {
			continue
		}
		limit := 0
		switch line[0] {
		case '*', '%', '~', '>', '|':
			limit = 64
		case '$', '=', '!':
			limit = 64 << 10
		default:
			continue
		}
		n, err := strconv.Atoi(string(bytes.TrimSuffix(line[1:], []byte("\r"))))
		// A number too large for Atoi counts as huge, whatever its sign.
		if err == nil && n > limit || errors.Is(err, strconv.ErrRange) {
			return true
		}
	}
	return false
}

// wireConn is a connection to a fake Redis, served as the client writes, with
// no goroutine: it refuses HELLO (so go-redis carries on without it),
// accepts CLIENT commands, and answers the first other command with reply,
// whatever it holds, and then hangs up (reads end with io.EOF).
type wireConn struct {
	reply   []byte
	in      []byte // written by the client, not yet served
	out     []byte // to be read by the client
	hungUp  bool
	replied bool
}

// Write serves every whole command in what the client has written.
func (c *wireConn) Write(p []byte) (int, error) {
	if c.hungUp {
		return 0, io.ErrClosedPipe
	}
	c.in = append(c.in, p...)
	for !c.replied {
		name, n, ok := parseCommand(c.in)
		if !ok {
			break
		}
		c.in = c.in[n:]
		switch strings.ToUpper(name) {
		case "HELLO":
			c.out = append(c.out, "-ERR unknown command 'HELLO'\r\n"...)
		case "CLIENT":
			c.out = append(c.out, "+OK\r\n"...)
		default:
			c.out = append(c.out, c.reply...)
			c.replied = true
		}
	}
	return len(p), nil
}

// Read returns what the server wrote, then io.EOF once it has hung up (or
// has nothing to say).
func (c *wireConn) Read(p []byte) (int, error) {
	if len(c.out) == 0 {
		c.hungUp = true
		return 0, io.EOF
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

func (c *wireConn) Close() error                     { c.hungUp = true; return nil }
func (c *wireConn) LocalAddr() net.Addr              { return wireAddr{} }
func (c *wireConn) RemoteAddr() net.Addr             { return wireAddr{} }
func (c *wireConn) SetDeadline(time.Time) error      { return nil }
func (c *wireConn) SetReadDeadline(time.Time) error  { return nil }
func (c *wireConn) SetWriteDeadline(time.Time) error { return nil }

// wireAddr is the address of both ends of a wireConn.
type wireAddr struct{}

func (wireAddr) Network() string { return "fuzz" }
func (wireAddr) String() string  { return "fuzz:6379" }

// parseCommand parses one RESP array of bulk strings at the start of b and
// returns its first element (the command's name) and its length in bytes.
// ok is false if b does not start with a whole command.
func parseCommand(b []byte) (name string, n int, ok bool) {
	line := func() (string, bool) {
		i := bytes.Index(b[n:], []byte("\r\n"))
		if i < 0 {
			return "", false
		}
		l := string(b[n : n+i])
		n += i + 2
		return l, true
	}
	h, ok := line()
	if !ok || !strings.HasPrefix(h, "*") {
		return "", 0, false
	}
	count, err := strconv.Atoi(h[1:])
	if err != nil || count < 1 {
		return "", 0, false
	}
	for i := range count {
		h, ok := line()
		if !ok || !strings.HasPrefix(h, "$") {
			return "", 0, false
		}
		size, err := strconv.Atoi(h[1:])
		if err != nil || size < 0 || n+size+2 > len(b) {
			return "", 0, false
		}
		if i == 0 {
			name = string(b[n : n+size])
		}
		n += size + 2
	}
	return name, n, true
}
