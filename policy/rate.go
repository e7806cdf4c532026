package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// units are the period names a rate may use: "100/min".
var units = map[string]time.Duration{
	"s": time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
}

// parseRate parses the text form of a rate, "COUNT/PERIOD": a positive
// number of tokens per period, the period being a unit (s, sec, second, m,
// min, minute, h, hour, d, day) or a Go duration ("10s", "1m30s", "500ms").
// It returns tokens per second; the bounds are checked by the caller.
func parseRate(s string) (float64, error) {
	count, period, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("%q is not COUNT/PERIOD (such as \"100/min\") or a number of tokens per second", s)
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(count), 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || n <= 0 {
		return 0, fmt.Errorf("%q: the count %q is not a positive number", s, count)
	}
	period = strings.TrimSpace(period)
	d, ok := units[period]
	if !ok {
		d, err = time.ParseDuration(period)
		if err != nil {
			return 0, fmt.Errorf("%q: the period %q is not a unit (s, m, h, d) or a duration such as 10s", s, period)
		}
		if d <= 0 {
			return 0, fmt.Errorf("%q: the period %q is not positive", s, period)
		}
	}
	return n / d.Seconds(), nil
}
