package bench

import (
	"fmt"

	"github.com/hybridlimit/hybrid/bench/plot"
	"github.com/hybridlimit/hybrid/internal/plural"
)

// Chart draws the admitted rate over time of each report, one line per
// mode, from their timelines, with the limit of a single key as a
// reference line, and the Redis outage, if any, shaded as a span labelled
// "Redis down" (from the earliest start to the latest end over the
// reports, which differ by milliseconds).
func Chart(sc Scenario, reports []Report) plot.Chart {
	c := plot.Chart{
		Title:  fmt.Sprintf("Admitted per mode: %s, %s, demand %gx the limit", plural.Count(sc.Instances, "instance"), plural.Count(max(sc.Keys, 1), "key"), sc.Demand),
		XLabel: "time (s)",
		YLabel: "admitted (tokens/s)",
	}
	cost := max(sc.Cost, 1)
	for _, r := range reports {
		s := plot.Series{Name: r.Mode}
		prev := 0.0
		for _, p := range r.Timeline {
			if dt := p.At - prev; dt > 0 {
				s.Points = append(s.Points, plot.Point{T: p.At, V: float64(p.Admitted*cost) / dt})
			}
			prev = p.At
		}
		c.Series = append(c.Series, s)
	}
	var from, to float64
	outage := false
	for _, r := range reports {
		if o := r.Outage; o != nil {
			if !outage || o.From < from {
				from = o.From
			}
			if !outage || o.To > to {
				to = o.To
			}
			outage = true
		}
	}
	if outage {
		c.Spans = append(c.Spans, plot.Span{From: from, To: to, Label: "Redis down"})
	}
	if sc.Keys <= 1 && sc.Rate > 0 {
		c.Lines = append(c.Lines, plot.HLine{Y: sc.Rate, Label: fmt.Sprintf("limit %g/s", sc.Rate)})
	}
	return c
}
