package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/internal/bubble"
)

// TestMain silences go-redis's own log, which reports the refused dials of
// the tests that close a Limiter's client.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// inBubble runs test in a synctest bubble with a Limiter on miniredis whose
// Redis clock is the bubble's (bubble.Run).
func inBubble(t *testing.T, test func(t *testing.T, lim *hybrid.Limiter)) {
	t.Helper()
	bubble.Run(t, hybrid.Config{Instances: 1}, test)
}

// slowRedis bounds the Redis calls of the Limiters that run in real time:
// a machine busy with other tests may keep miniredis from answering within
// the 50ms of the default, and the Limiter would then deny a cold key (a
// slow Redis is no outage) or fall back.
var slowRedis = breaker.Config{CallTimeout: 10 * time.Second, MaxCallTimeout: 10 * time.Second}

// newLimiter returns a Limiter on miniredis in real time, closed when t
// ends, for the tests over TCP and the benchmarks.
func newLimiter(t testing.TB) *hybrid.Limiter {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	lim, err := hybrid.New(rdb, hybrid.Config{Instances: 1, LocalCapacity: 1e9, Breaker: slowRedis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lim.Close(context.Background())
		rdb.Close()
	})
	return lim
}

// newInterceptor returns an Interceptor, failing the test if New does.
func newInterceptor(t testing.TB, lim *hybrid.Limiter, cfg grpclimit.Config) *grpclimit.Interceptor {
	t.Helper()
	ic, err := grpclimit.New(lim, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return ic
}

// server is a gRPC server of the health service behind an Interceptor, and
// a client of it.
type server struct {
	health healthpb.HealthClient
	conn   *grpc.ClientConn
	// served counts the calls that went past the Interceptor to the
	// service.
	served atomic.Int64
}

// options are the options of a test server: the address the server sees
// as its peer (nil: bufconn's own, which is no IP address), and options of
// the client.
type options struct {
	peer   net.Addr
	client []grpc.DialOption
}

// serve starts a server with ic in front of the health service, on bufconn,
// and returns it with a client connected; both stop when t ends. In a
// bubble, everything runs in it.
func serve(t testing.TB, ic *grpclimit.Interceptor, opts options) *server {
	t.Helper()
	buf := bufconn.Listen(1 << 16)
	var lis net.Listener = buf
	if opts.peer != nil {
		lis = peerListener{buf, opts.peer}
	}
	s := start(t, lis, ic)
	dial := func(ctx context.Context, _ string) (net.Conn, error) { return buf.DialContext(ctx) }
	s.connect(t, "passthrough:///bufconn", append(opts.client, grpc.WithContextDialer(dial))...)
	return s
}

// start serves the health service on lis behind ic (nil: no limit), until
// t ends.
func start(t testing.TB, lis net.Listener, ic *grpclimit.Interceptor) *server {
	t.Helper()
	s := &server{}
	unary := []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.served.Add(1)
		return h(ctx, req)
	}}
	stream := []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.served.Add(1)
		return h(srv, ss)
	}}
	if ic != nil {
		unary = append([]grpc.UnaryServerInterceptor{ic.Unary()}, unary...)
		stream = append([]grpc.StreamServerInterceptor{ic.Stream()}, stream...)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// connect connects s's client to target.
func (s *server) connect(t testing.TB, target string, opts ...grpc.DialOption) {
	t.Helper()
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn = conn
	s.health = healthpb.NewHealthClient(conn)
}

// peerListener is a listener whose connections report addr as the
// address of their remote end: the peer the server sees.
type peerListener struct {
	net.Listener
	addr net.Addr
}

func (l peerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return peerConn{c, l.addr}, nil
}

// peerConn is a connection whose remote end is addr.
type peerConn struct {
	net.Conn
	addr net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.addr }

// tcpAddr returns the TCP address of "ip:port".
func tcpAddr(s string) net.Addr {
	return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))
}

// check makes a Check call with the metadata given as key, value pairs,
// and returns its error and its header and trailer metadata.
func (s *server) check(ctx context.Context, kv ...string) (header, trailer metadata.MD, err error) {
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	_, err = s.health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	return header, trailer, err
}

// watch starts a Watch stream with the metadata given as key, value pairs,
// and returns its header metadata and the error of its first message; the
// stream ends when the test does.
func (s *server) watch(t testing.TB, kv ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	w, err := s.health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	header, herr := w.Header()
	resp, err := w.Recv()
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Watch: status %v, want SERVING", resp.GetStatus())
	}
	if herr != nil && err == nil {
		err = herr
	}
	return header, err
}

// item is one member of a structured-field list with integer parameters.
type item struct {
	name   string
	params map[string]int64
}

// parseList parses a structured-field list of strings with integer
// parameters, `"a";q=1;w=2, "b";q=3`, as the ratelimit and ratelimit-policy
// metadata carry, following RFC 9651 section 4.2. It reports what it
// cannot parse as an error of t.
func parseList(t testing.TB, field, s string) []item {
	t.Helper()
	var items []item
	fail := func(why string) []item {
		t.Helper()
		t.Errorf("%s: %q: %s", field, s, why)
		return nil
	}
	for s != "" {
		if s[0] != '"' {
			return fail("a member does not start with a string")
		}
		var name strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' {
				i++
				if i == len(s) || s[i] != '"' && s[i] != '\\' {
					return fail("bad escape")
				}
			}
			name.WriteByte(s[i])
		}
		if i == len(s) {
			return fail("unterminated string")
		}
		s = s[i+1:]
		it := item{name: name.String(), params: map[string]int64{}}
		for strings.HasPrefix(s, ";") {
			k, rest, found := strings.Cut(s[1:], "=")
			if !found {
				return fail("a parameter without a value")
			}
			end := strings.IndexAny(rest, ";,")
			if end < 0 {
				end = len(rest)
			}
			v, err := strconv.ParseInt(rest[:end], 10, 64)
			if err != nil || v < 0 {
				return fail("parameter " + k + " is not a structured-field Integer")
			}
			it.params[k] = v
			s = rest[end:]
		}
		items = append(items, it)
		if s == "" {
			break
		}
		if !strings.HasPrefix(s, ", ") {
			return fail("members not separated by \", \"")
		}
		s = s[2:]
	}
	return items
}

// limits returns what the rate-limit metadata of header say, each field
// as one list, and fails t if a field is sent more than once.
func limits(t testing.TB, header metadata.MD) (policy, rateLimit []item) {
	t.Helper()
	p, r := header.Get("ratelimit-policy"), header.Get("ratelimit")
	if len(p) > 1 || len(r) > 1 {
		t.Errorf("a rate-limit field sent more than once: %q, %q", p, r)
	}
	if len(p) > 0 {
		policy = parseList(t, "ratelimit-policy", p[0])
	}
	if len(r) > 0 {
		rateLimit = parseList(t, "ratelimit", r[0])
	}
	return policy, rateLimit
}
