package plot

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// fitTicks picks the ticks for an axis of the given length in pixels: as
// many as fit with at least minGap pixels between them, or (when byWidth)
// enough room for their labels side by side.
func fitTicks(lo, hi, length, minGap float64, byWidth bool) ([]float64, float64) {
	n := max(2, min(10, int(length/90)))
	if !byWidth {
		n = max(2, min(8, int(length/minGap)))
	}
	for {
		ticks, step := niceTicks(lo, hi, n)
		if n <= 2 || len(ticks) < 2 {
			return ticks, step
		}
		gap := length / float64(len(ticks)-1)
		need := minGap
		if byWidth {
			widest := 0
			for _, s := range tickLabels(ticks, step) {
				widest = max(widest, utf8.RuneCountInString(s))
			}
			need = float64(widest)*charWidth + 16
		}
		if gap >= need {
			return ticks, step
		}
		n--
	}
}

// niceTicks returns evenly spaced ticks from at most lo to at least hi, and
// their step: 1, 2 or 5 times a power of ten, the smallest such step that
// makes about n intervals. The first and last tick are the axis ends. Each
// tick is a correctly rounded multiple of the step, so 0.3 is 0.3 and not
// 0.30000000000000004. If lo equals hi the range is widened around it;
// if either is not finite, niceTicks returns just {0, 1} and step 1.
func niceTicks(lo, hi float64, n int) ([]float64, float64) {
	if !finite(lo) || !finite(hi) {
		return []float64{0, 1}, 1
	}
	if lo > hi {
		lo, hi = hi, lo
	}
	if lo == hi {
		d := math.Abs(lo) / 10
		if d == 0 {
			d = 1
		}
		lo, hi = lo-d, hi+d
	}
	n = max(n, 1)
	raw := hi/float64(n) - lo/float64(n) // no overflow for huge ranges
	e := int(math.Floor(math.Log10(raw)))
	m := 10.0
	for _, c := range []float64{1, 2, 5} {
		if c*math.Pow10(e) >= raw*(1-1e-9) {
			m = c
			break
		}
	}
	if m == 10 {
		m, e = 1, e+1
	}
	step := m * math.Pow10(e)
	// tick is the i-th multiple of the step, rounded once.
	tick := func(i float64) float64 {
		if e >= 0 {
			return i * m * math.Pow10(e)
		}
		return i * m / math.Pow10(-e)
	}
	first := math.Floor(lo/step + 1e-9)
	last := math.Ceil(hi/step - 1e-9)
	if !finite(first) || !finite(last) || last-first > 1000 || last <= first {
		return []float64{lo, hi}, hi - lo
	}
	ticks := make([]float64, 0, int(last-first)+1)
	for i := first; i <= last; i++ {
		ticks = append(ticks, tick(i))
	}
	return ticks, step
}

// tickLabels formats ticks compactly: as many decimals as the step needs,
// and a k, M or G suffix for large values.
func tickLabels(ticks []float64, step float64) []string {
	big := 0.0
	for _, t := range ticks {
		big = max(big, math.Abs(t))
	}
	unit, suffix := 1.0, ""
	switch {
	case big >= 1e13:
		labels := make([]string, len(ticks))
		for i, t := range ticks {
			labels[i] = strconv.FormatFloat(t, 'g', 3, 64)
		}
		return labels
	case big >= 1e10:
		unit, suffix = 1e9, "G"
	case big >= 1e7:
		unit, suffix = 1e6, "M"
	case big >= 1e4:
		unit, suffix = 1e3, "k"
	}
	// As few decimals as show the step exactly: 0.2 needs one, 2.5k one.
	decimals := 0
	for ; decimals < 12 && step > 0; decimals++ {
		x := step / unit * math.Pow10(decimals)
		if math.Abs(x-math.Round(x)) <= 1e-6*x {
			break
		}
	}
	labels := make([]string, len(ticks))
	for i, t := range ticks {
		s := strconv.FormatFloat(t/unit, 'f', decimals, 64)
		if strings.Contains(s, ".") {
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
		}
		if s == "-0" || s == "0" {
			s = "0"
		} else {
			s += suffix
		}
		labels[i] = s
	}
	return labels
}
