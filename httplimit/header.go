package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/plural"
)

// The header field names, in canonical form so that they are set without
// canonicalizing them on every request and found by http.Header.Get.
const (
	hdrPolicy     = "Ratelimit-Policy"
	hdrRateLimit  = "Ratelimit"
	hdrLimit      = "X-Ratelimit-Limit"
	hdrRemaining  = "X-Ratelimit-Remaining"
	hdrReset      = "X-Ratelimit-Reset"
	hdrRetryAfter = "Retry-After"
)

// sfMaxInt is the largest Integer of RFC 9651 structured fields: values are
// capped to it.
const sfMaxInt = 999_999_999_999_999

// setHeaders sets the selected header fields of decision d on checks:
// RateLimit-Policy (AppendPolicy, or the single tier's, computed once),
// RateLimit (AppendRateLimit), and the X-RateLimit fields, which describe
// the tier that denied, or the allowed tier with the fewest tokens left;
// X-RateLimit-Reset is the t of that tier, or the Unix time t seconds from
// now.
//
// The values are built in one buffer and set as substrings of one string,
// in one slice: two allocations for all of them.
func (m *Middleware) setHeaders(h http.Header, checks []hybrid.Check, d *hybrid.Decision) {
	var arr [512]byte
	b := arr[:0]
	var ends [5]int
	n := 0
	policy := m.headers&PolicyHeader != 0 && m.checks != nil // else m.policy
	if policy {
		b = AppendPolicy(b, checks)
		ends[n] = len(b)
		n++
	}
	if m.headers&RateLimitHeader != 0 {
		b = AppendRateLimit(b, checks, *d)
		ends[n] = len(b)
		n++
	}
	if m.headers&LegacyHeaders != 0 {
		res := d.Result()
		reset := retrySeconds(d)
		if reset < 0 {
			reset = resetSeconds(res.ResetAfter)
		}
		if m.resetUnix {
			reset += time.Now().Unix()
		}
		b = strconv.AppendInt(b, res.Limit.Burst, 10)
		ends[n] = len(b)
		b = strconv.AppendInt(b, max(res.Remaining, 0), 10)
		ends[n+1] = len(b)
		b = strconv.AppendInt(b, reset, 10)
		ends[n+2] = len(b)
		n += 3
	}
	s := string(b)
	vals := make([]string, n+1)
	start := 0
	for i := range n {
		vals[i] = s[start:ends[i]]
		start = ends[i]
	}
	// Each field gets a slice of its own of length and capacity 1, so that
	// an Add by a later handler copies it rather than overwriting another.
	i := 0
	next := func() []string {
		v := vals[i : i+1 : i+1]
		i++
		return v
	}
	if m.headers&PolicyHeader != 0 {
		if policy {
			h[hdrPolicy] = next()
		} else {
			vals[n] = m.policy
			h[hdrPolicy] = vals[n : n+1 : n+1]
		}
	}
	if m.headers&RateLimitHeader != 0 {
		h[hdrRateLimit] = next()
	}
	if m.headers&LegacyHeaders != 0 {
		h[hdrLimit] = next()
		h[hdrRemaining] = next()
		h[hdrReset] = next()
	}
}

// AppendPolicy appends to b the value of the RateLimit-Policy field of
// draft-ietf-httpapi-ratelimit-headers (section 3) for checks, and returns
// the extended buffer: a structured-field List with one member per check,
// `"tier";q=burst;w=window`, the tier being the check's Tier as it is, the
// quota its burst, and the window the seconds an empty bucket takes to fill
// (burst/rate, rounded up, at least 1), so that q/w is the rate. Tier names
// are quoted with '"' and '\' escaped, and a byte a String cannot hold is
// written as '_'; numbers are capped at 999,999,999,999,999.
//
// It is the formatting of the middleware's field, exported so that other
// protocols report limits in the same form: package grpclimit sends it as
// the "ratelimit-policy" metadata of gRPC responses.
func AppendPolicy(b []byte, checks []hybrid.Check) []byte {
	for i := range checks {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicy(b, checks[i].Tier, checks[i].Limit)
	}
	return b
}

// AppendRateLimit appends to b the value of the RateLimit field of
// draft-ietf-httpapi-ratelimit-headers (section 4) for d, the decision of
// hybrid.Limiter.AllowAll on checks, and returns the extended buffer: a
// structured-field List with one member per tier decided,
// `"tier";r=remaining;t=seconds`, r being the whole tokens left and t the
// seconds until the bucket is full again (rounded up). For the tier that
// denied, t is the seconds until the request could pass (its Retry-After:
// RetryAfter rounded up, at least 1); in a denial no tier's t goes beyond
// it, and a tier decided before the one that denied shows what it holds
// once its tokens are given back. Tiers are named and values capped as by
// AppendPolicy.
//
// Like AppendPolicy, it is exported for other protocols: package grpclimit
// sends it as the "ratelimit" metadata of gRPC responses.
func AppendRateLimit(b []byte, checks []hybrid.Check, d hybrid.Decision) []byte {
	retry := retrySeconds(&d)
	for i, res := range d.Results {
		if i >= len(checks) {
			break
		}
		c := &checks[i]
		rem := res.Remaining
		t := resetSeconds(res.ResetAfter)
		switch {
		case i == d.Denied:
			t = retry
		case retry >= 0:
			// Denied by a later tier: this one's tokens were given
			// back, and the client is to wait for Retry-After anyway.
			rem = min(rem+costOf(c), c.Limit.Burst)
			t = min(t, retry)
		}
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, c.Tier)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, clampSF(rem), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, clampSF(t), 10)
	}
	return b
}

// retrySeconds returns the Retry-After of a denial d, in whole seconds,
// rounded up and at least 1, and -1 if d allowed.
func retrySeconds(d *hybrid.Decision) int64 {
	if d.Allowed || d.Denied < 0 || d.Denied >= len(d.Results) {
		return -1
	}
	return max(ceilSeconds(d.Results[d.Denied].RetryAfter), 1)
}

// appendPolicy appends the RateLimit-Policy item of a tier named name.
func appendPolicy(b []byte, name string, lim hybrid.Limit) []byte {
	b = appendSFString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, clampSF(lim.Burst), 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, window(lim), 10)
}

// window returns the seconds that lim takes to fill an empty bucket,
// burst/rate rounded up, at least 1. A quotient within a millionth of a
// second above a whole number is that number: a limit of 2 a minute has a
// window of 60 seconds, although its refill rounded to micro-tokens takes
// 60.0006.
func window(lim hybrid.Limit) int64 {
	if !(lim.Rate > 0) || lim.Burst < 1 {
		return 1
	}
	w := math.Ceil(float64(lim.Burst)/lim.Rate - 1e-6)
	if !(w < sfMaxInt) { // also NaN
		return sfMaxInt
	}
	return max(int64(w), 1)
}

// appendSFString appends s as an RFC 9651 String: quoted, with '"' and '\'
// escaped. A byte that a String cannot hold (a control or a non-ASCII byte)
// is written as '_'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// clampSF clamps n to the Integers of structured fields that are not
// negative.
func clampSF(n int64) int64 {
	return min(max(n, 0), sfMaxInt)
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}

// resetSeconds returns d in whole seconds, rounded up, but for a
// millisecond: the refill of a limit such as 2 a minute, rounded to
// micro-tokens, takes 30.0003 s a token, which is reported as 30.
func resetSeconds(d time.Duration) int64 {
	return ceilSeconds(d - time.Millisecond)
}

// itoa formats n in decimal.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// quotaExceeded is the problem type of draft-ietf-httpapi-ratelimit-headers
// for a request beyond a quota policy.
const quotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// The extension members of a denial.
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	Tier             string   `json:"tier,omitempty"`
	RetryAfter       int64    `json:"retry-after,omitempty"`
}

// WriteDenial is the default Config.DenyResponse: 429 Too Many Requests with
// Retry-After (whole seconds, rounded up, at least 1; kept if w has one
// already) and an RFC 9457 application/problem+json body of the
// quota-exceeded type of draft-ietf-httpapi-ratelimit-headers, with the
// extension members "violated-policies" (the tier, as the draft defines
// it), "tier" and "retry-after" (seconds).
func WriteDenial(w http.ResponseWriter, r *http.Request, d Denial) {
	secs := d.RetryAfterSeconds()
	h := w.Header()
	if _, ok := h[hdrRetryAfter]; !ok {
		h[hdrRetryAfter] = []string{itoa(secs)}
	}
	writeProblem(w, problem{
		Type:   quotaExceeded,
		Title:  "Quota Exceeded",
		Status: http.StatusTooManyRequests,
		Detail: fmt.Sprintf("The request costs %s and tier %q holds %d of its %d now; retry after %s.",
			plural.Count(d.Cost, "token"), d.Tier, d.Remaining, d.Limit.Burst, plural.Count(secs, "second")),
		ViolatedPolicies: []string{d.Tier},
		Tier:             d.Tier,
		RetryAfter:       secs,
	})
}

// WriteError is the default Config.ErrorResponse: the status of ErrorStatus
// with an RFC 9457 application/problem+json body. The detail says what kind
// of problem it was, never err's text, which may hold keys or internals.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	status := ErrorStatus(err)
	var detail string
	switch {
	case errors.Is(err, hybrid.ErrInvalidCost):
		detail = "The request costs more tokens than its rate limit can ever hold."
	case status == http.StatusBadRequest:
		detail = "The request carries nothing to apply its rate limit to."
	case status == http.StatusServiceUnavailable:
		detail = "The rate limiter is not available."
	default:
		detail = "The rate limit could not be applied."
	}
	writeProblem(w, problem{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
	})
}

// writeProblem writes p as the response.
func writeProblem(w http.ResponseWriter, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // strings and integers: cannot happen
		body = []byte(`{"type":"about:blank"}`)
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(p.Status)
	w.Write(body)
}
