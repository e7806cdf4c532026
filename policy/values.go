package policy

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// rateOf returns the rate of a rule's "rate" value, in tokens per second,
// within the limiter's bounds.
func rateOf(v value) (float64, error) {
	var rate float64
	if s, ok := v.str(); ok {
		var err error
		if rate, err = parseRate(s); err != nil {
			return 0, err
		}
	} else if f, ok := v.number(); ok {
		rate = f
	} else {
		return 0, fmt.Errorf("want a number of tokens per second or a string such as \"100/min\", got %s", v.kind())
	}
	if !(rate >= limit.MinRate && rate <= limit.MaxRate) {
		return 0, fmt.Errorf("%s is %.6g tokens/s, outside [%g, %g]", v.raw, rate, limit.MinRate, float64(limit.MaxRate))
	}
	return rate, nil
}

// parseTier parses a rule's tier, returning the canonical header name for
// "header:NAME".
func parseTier(s string) (tierKind, string, error) {
	switch s {
	case "user":
		return tierUser, "", nil
	case "api_key":
		return tierAPIKey, "", nil
	case "ip":
		return tierIP, "", nil
	case "endpoint":
		return tierEndpoint, "", nil
	case "global":
		return tierGlobal, "", nil
	}
	name, ok := strings.CutPrefix(s, "header:")
	if !ok {
		return 0, "", fmt.Errorf("%q is not user, api_key, ip, endpoint, global or header:NAME", s)
	}
	if name == "" || len(name) > maxHeaderLen {
		return 0, "", fmt.Errorf("%q: a header name is 1 to %d bytes", s, maxHeaderLen)
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return 0, "", fmt.Errorf("%q: %q is not a valid header name", s, name)
		}
	}
	return tierHeader, http.CanonicalHeaderKey(name), nil
}

// isTokenChar reports whether c may be in an HTTP header name (RFC 9110
// token).
func isTokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// suggest returns " (did you mean "x"?)" for a known field close to key,
// else the list of the known fields.
func suggest(key string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, key) || distance(k, key) <= 2 {
			return fmt.Sprintf(" (did you mean %q?)", k)
		}
	}
	return " (want " + strings.Join(known, ", ") + ")"
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checkName reports whether s may name a plan or a rule: 1 to 64 ASCII
// letters, digits, '_', '-' and '.'.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("%q is %d bytes long, more than %d", s, len(s), maxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%q has %q: a name is letters, digits, '_', '-' and '.'", s, c)
		}
	}
	return nil
}
