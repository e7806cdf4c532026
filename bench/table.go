package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"
)

// tableHeader names WriteTable's columns.
const tableHeader = "mode\tdec/s\tlate\tp50\tp99\tp99.9\tcmd/dec\tadmitted\tideal(sat)\tadm/ideal\tovershoot\tunder\tmem/key\tfallback\tredis err\terrors"

// WriteTable writes reports as a table, one aligned row per report under a
// header line:
//
//   - dec/s: decisions per second achieved (Report.Offered is what was
//     asked for); late: the share of requests issued more than LateAfter
//     behind schedule;
//   - p50, p99, p99.9: decision latency;
//   - cmd/dec: Redis commands per decision;
//   - admitted: tokens admitted, all keys; ideal(sat): B + R*T summed over
//     the saturated keys; adm/ideal: what those keys were admitted, as a
//     share of it;
//   - overshoot: the largest excess of a key over B + R*T, in tokens and
//     percent, and for optimistic mode "of" the documented bound
//     (Limiter.Overshoot); under: how far adm/ideal falls short of 100%;
//   - mem/key: heap per tracked key ("-": not measured);
//   - fallback: decisions made by the fallback policy; redis err: the
//     hybrid Limiters' failed calls to Redis (Report.RedisErrors); errors:
//     failed decisions.
//
// If any report has an Outage, five columns follow, for the decisions
// issued while Redis was down: out dec/s, out p50, out p99, out fallback
// (the share the fallback policy made) and recovery (OutageReport.Recovery;
// "-" for a mode without a hybrid Limiter, "none" if not within the run).
func WriteTable(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	outage := false
	for _, r := range reports {
		outage = outage || r.Outage != nil
	}
	if outage {
		fmt.Fprintln(tw, tableHeader+"\t"+outageHeader+"\t")
	} else {
		fmt.Fprintln(tw, tableHeader+"\t")
	}
	for _, r := range reports {
		late := 0.0
		if r.Decisions > 0 {
			late = 100 * float64(r.Late) / float64(r.Decisions)
		}
		adm, under := "-", "-"
		if r.SaturatedKeys > 0 {
			adm = fmt.Sprintf("%.2f%%", r.AdmittedPct)
			under = fmt.Sprintf("%.2f%%", r.UnderPct)
		}
		over := "0"
		if r.Overshoot > 0 {
			over = fmt.Sprintf("+%.0f (%.2f%%)", r.Overshoot, r.OvershootPct)
		}
		if r.OvershootBound > 0 {
			over += fmt.Sprintf(" of %d", r.OvershootBound)
		}
		mem := "-"
		if r.MemPerKey > 0 {
			mem = fmt.Sprintf("%.0f B", r.MemPerKey)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f%%\t%s\t%s\t%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t",
			r.Mode, r.DecisionsPerSec, late,
			fmtDuration(r.P50), fmtDuration(r.P99), fmtDuration(r.P999),
			fmtPerDecision(r.CommandsPerDecision), r.AdmittedTokens, r.IdealSaturated, adm, over, under, mem,
			r.Fallback, r.RedisErrors, r.Errors)
		if outage {
			writeOutage(tw, r)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// fmtPerDecision formats a count per decision with at least two significant
// digits and at least four decimals: 1.0007, 0.0540, 0.000031.
func fmtPerDecision(v float64) string {
	if v <= 0 {
		return "0"
	}
	decimals := 4
	if d := 1 - int(math.Floor(math.Log10(v))); d > decimals {
		decimals = d
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// outageHeader names the outage columns.
const outageHeader = "out dec/s\tout p50\tout p99\tout fallback\trecovery"

// writeOutage writes r's outage columns.
func writeOutage(w io.Writer, r Report) {
	o := r.Outage
	if o == nil {
		fmt.Fprint(w, "-\t-\t-\t-\t-\t")
		return
	}
	rec := "-"
	switch {
	case o.Recovered:
		rec = fmtDuration(o.Recovery)
	case r.Mode == Lease || r.Mode == Optimistic || r.Mode == Exact:
		rec = "none"
	}
	fmt.Fprintf(w, "%.0f\t%s\t%s\t%.1f%%\t%s\t",
		o.DecisionsPerSec, fmtDuration(o.P50), fmtDuration(o.P99), o.FallbackPct, rec)
}

// fmtDuration formats d with three or four significant digits.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// sweepHeader names WriteSweep's columns.
const sweepHeader = "mode\tsync\tlocal cap\tcmd/dec\tadm/ideal\tovershoot\tunder\tp99\tfallback\tredis err"

// WriteSweep writes reports of one scenario run with different SyncInterval
// and LocalCapacity settings, one row per report: accuracy (adm/ideal,
// overshoot, under) against Redis load (cmd/dec), for choosing the two.
func WriteSweep(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, sweepHeader+"\t")
	for _, r := range reports {
		adm, under := "-", "-"
		if r.SaturatedKeys > 0 {
			adm = fmt.Sprintf("%.2f%%", r.AdmittedPct)
			under = fmt.Sprintf("%.2f%%", r.UnderPct)
		}
		over := "0"
		if r.Overshoot > 0 {
			over = fmt.Sprintf("+%.0f (%.2f%%)", r.Overshoot, r.OvershootPct)
		}
		fmt.Fprintf(tw, "%s\t%v\t%d\t%.4f\t%s\t%s\t%s\t%s\t%d\t%d\t\n",
			r.Mode, r.SyncInterval, r.LocalCapacity, r.CommandsPerDecision, adm, over, under,
			fmtDuration(r.P99), r.Fallback, r.RedisErrors)
	}
	return tw.Flush()
}
