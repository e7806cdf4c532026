package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/httplimit"
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

// newMiddleware returns the handler of a Middleware configured by cfg around
// ok, failing the test if New does.
func newMiddleware(t *testing.T, lim *hybrid.Limiter, cfg httplimit.Config) (*httplimit.Middleware, http.Handler) {
	t.Helper()
	mw, err := httplimit.New(lim, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return mw, mw.Handler(ok)
}

// ok is the handler behind the middleware: 200 and "ok".
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Write([]byte("ok"))
})

// request returns a GET of target from remote with the header lines given
// as name, value pairs.
func request(target, remote string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// serve serves r with h and returns the response.
func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// item is one member of a structured-field list with integer parameters.
type item struct {
	name   string
	params map[string]int64
}

// parseList parses a structured-field list of strings with integer
// parameters, `"a";q=1;w=2, "b";q=3`, as RateLimit and RateLimit-Policy
// carry. It is written independently of the package's writer, following
// RFC 9651 section 4.2.
func parseList(t *testing.T, field, s string) []item {
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
			} else if s[i] < 0x20 || s[i] > 0x7e {
				return fail("a byte a String cannot hold")
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
			if err != nil || v < 0 || v > 999_999_999_999_999 || rest[0] == '+' {
				return fail("parameter " + k + " is not a structured-field Integer")
			}
			if _, dup := it.params[k]; dup {
				return fail("parameter " + k + " twice")
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

// limits is what the rate-limit fields of a response say.
type limits struct {
	policy, rateLimit              []item
	limit, remaining, reset, retry int64 // -1: absent
}

// readLimits parses the rate-limit fields of w.
func readLimits(t *testing.T, w *httptest.ResponseRecorder) limits {
	t.Helper()
	h := w.Result().Header
	num := func(name string) int64 {
		t.Helper()
		v := h.Get(name)
		if v == "" {
			return -1
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Errorf("%s: %q is not an integer", name, v)
		}
		return n
	}
	l := limits{
		limit:     num("X-RateLimit-Limit"),
		remaining: num("X-RateLimit-Remaining"),
		reset:     num("X-RateLimit-Reset"),
		retry:     num("Retry-After"),
	}
	if len(h.Values("RateLimit-Policy")) > 1 || len(h.Values("RateLimit")) > 1 {
		t.Errorf("a rate-limit field set more than once: %q, %q", h.Values("RateLimit-Policy"), h.Values("RateLimit"))
	}
	if v := h.Get("RateLimit-Policy"); v != "" {
		l.policy = parseList(t, "RateLimit-Policy", v)
	}
	if v := h.Get("RateLimit"); v != "" {
		l.rateLimit = parseList(t, "RateLimit", v)
	}
	return l
}
