package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
)

// Health is what a run's hybrid Limiters counted of their calls to Redis,
// summed over the instances (from hybrid.Stats): where their failed calls
// failed, the requests that waited for Redis in vain, and the breakers'
// transitions. Report.RedisErrors is the sum of the first six fields.
type Health struct {
	// RoundErrors counts settlement rounds whose round trip failed or was
	// refused by the breaker; KeyErrors the key settlements that failed.
	RoundErrors uint64 `json:"round_errors"`
	KeyErrors   uint64 `json:"key_errors"`
	// FetchErrors counts fetches that failed; FetchTimeouts the requests
	// that stopped waiting for a fetch (Config.ColdWait, or their
	// deadline).
	FetchErrors   uint64 `json:"fetch_errors"`
	FetchTimeouts uint64 `json:"fetch_timeouts"`
	// HeartbeatErrors counts heartbeats that failed; ExactErrors the
	// Exact script calls that failed (those fell back).
	HeartbeatErrors uint64 `json:"heartbeat_errors"`
	ExactErrors     uint64 `json:"exact_errors"`
	// Unanswered counts the requests denied because Redis did not answer
	// them within ColdWait while the breaker was closed (hybrid.Stats).
	Unanswered uint64 `json:"unanswered"`
	// Pressured counts calls that ran out of time while Redis answered
	// others: not failures for the breakers.
	Pressured uint64 `json:"pressured"`
	// Uncertain counts settlements that got no reply, so may have been
	// applied, and were sent again.
	Uncertain uint64 `json:"uncertain"`
	// Transitions counts the breakers' state changes, Opened those to
	// open.
	Transitions uint64 `json:"transitions"`
	Opened      uint64 `json:"opened"`
	// Rounds counts the settlement calls of rounds that Redis answered;
	// RoundTripSum is their total duration and RoundTripMax the longest
	// (Reconcile.RoundTrip).
	Rounds       uint64        `json:"rounds"`
	RoundTripSum time.Duration `json:"round_trip_sum_ns"`
	RoundTripMax time.Duration `json:"round_trip_max_ns"`
	// Batches counts the round trips that carried the settlements
	// requests needed at once (fetches, takes, exact decisions), Batched
	// the settlements they carried (Reconcile.Batches, Batched).
	Batches uint64 `json:"batches"`
	Batched uint64 `json:"batched"`
	// Queued counts the settlements of those that waited for a batch on
	// its way to come back before theirs could leave, QueueWaitSum how
	// long in all and QueueWaitMax the longest (Reconcile.Queued,
	// QueueWait).
	Queued       uint64        `json:"queued"`
	QueueWaitSum time.Duration `json:"queue_wait_sum_ns"`
	QueueWaitMax time.Duration `json:"queue_wait_max_ns"`
	// Window is the largest window of batches of any instance's node at
	// the end of the run, PathRTT the least round trip of late any
	// instance measured of its batches (Reconcile.Nodes).
	Window  int           `json:"window"`
	PathRTT time.Duration `json:"path_rtt_ns"`
	// BatchRTT is the largest smoothed round trip of a batch at the end
	// of the run, of any instance's node.
	BatchRTT time.Duration `json:"batch_rtt_ns"`
	// BatchTrips counts the batches Redis answered, BatchTripSum their
	// round trips in all and BatchTripMax the longest, over the run
	// (Reconcile.BatchTrip).
	BatchTrips   uint64        `json:"batch_trips"`
	BatchTripSum time.Duration `json:"batch_trip_sum_ns"`
	BatchTripMax time.Duration `json:"batch_trip_max_ns"`
}

// observe adds one Limiter's statistics to h.
func (h *Health) observe(st hybrid.Stats) {
	rc := st.Reconcile
	h.RoundErrors += rc.RoundErrors
	h.KeyErrors += rc.KeyErrors
	h.FetchErrors += rc.FetchErrors
	h.FetchTimeouts += rc.FetchTimeouts
	h.HeartbeatErrors += rc.HeartbeatErrors
	h.ExactErrors += st.ExactErrors
	h.Unanswered += st.Unanswered
	h.Pressured += rc.Pressured
	h.Uncertain += rc.Uncertain
	h.Transitions += rc.Transitions
	for from := range rc.BreakerTransitions {
		h.Opened += rc.BreakerTransitions[from][breaker.Open]
	}
	h.Rounds += rc.RoundTrip.Count
	h.RoundTripSum += rc.RoundTrip.Sum
	h.RoundTripMax = max(h.RoundTripMax, rc.RoundTrip.Max)
	h.Batches += rc.Batches
	h.Batched += rc.Batched
	h.Queued += rc.Queued
	h.QueueWaitSum += rc.QueueWait.Sum
	h.QueueWaitMax = max(h.QueueWaitMax, rc.QueueWait.Max)
	h.BatchTrips += rc.BatchTrip.Count
	h.BatchTripSum += rc.BatchTrip.Sum
	h.BatchTripMax = max(h.BatchTripMax, rc.BatchTrip.Max)
	for _, n := range rc.Nodes {
		h.window(n.Window, n.PathRTT, n.BatchRTT)
	}
}

// window keeps the largest window, the least path round trip and the
// largest smoothed round trip of a batch.
func (h *Health) window(w int, path, batch time.Duration) {
	h.Window = max(h.Window, w)
	h.BatchRTT = max(h.BatchRTT, batch)
	if path > 0 && (h.PathRTT == 0 || path < h.PathRTT) {
		h.PathRTT = path
	}
}

// add adds o to h.
func (h *Health) add(o Health) {
	h.RoundErrors += o.RoundErrors
	h.KeyErrors += o.KeyErrors
	h.FetchErrors += o.FetchErrors
	h.FetchTimeouts += o.FetchTimeouts
	h.HeartbeatErrors += o.HeartbeatErrors
	h.ExactErrors += o.ExactErrors
	h.Unanswered += o.Unanswered
	h.Pressured += o.Pressured
	h.Uncertain += o.Uncertain
	h.Transitions += o.Transitions
	h.Opened += o.Opened
	h.Rounds += o.Rounds
	h.RoundTripSum += o.RoundTripSum
	h.RoundTripMax = max(h.RoundTripMax, o.RoundTripMax)
	h.Batches += o.Batches
	h.Batched += o.Batched
	h.Queued += o.Queued
	h.QueueWaitSum += o.QueueWaitSum
	h.QueueWaitMax = max(h.QueueWaitMax, o.QueueWaitMax)
	h.BatchTrips += o.BatchTrips
	h.BatchTripSum += o.BatchTripSum
	h.BatchTripMax = max(h.BatchTripMax, o.BatchTripMax)
	h.window(o.Window, o.PathRTT, o.BatchRTT)
}

// errors returns the failed calls: Report.RedisErrors.
func (h *Health) errors() uint64 {
	return h.RoundErrors + h.KeyErrors + h.FetchErrors + h.FetchTimeouts + h.HeartbeatErrors + h.ExactErrors
}

// healthHeader names WriteHealth's columns.
const healthHeader = "mode\tround rtt\trtt max\tround err\tkey err\tfetch err\tfetch t/o\tunanswered\thb err\texact err\tpressured\tuncertain\tbreaker\topened\tbatch\twindow\tpath rtt\tbatch rtt\tbatch max\tqueued\twait\twait max"

// WriteHealth writes, for the reports of hybrid modes (those with a
// Health), one row each of what their Limiters counted of their calls to
// Redis: the mean and longest round trip of their settlement rounds, the
// failed calls by kind (round, key, fetch, fetch t/o for requests that
// stopped waiting for a fetch, hb for heartbeats, exact), the requests
// denied unanswered, the calls that ran out of time while Redis answered
// others (pressured), the settlements in doubt (uncertain), and the
// breakers' transitions, those to open apart, and the batches of requests:
// how many went together on average (batch), the largest window of batches
// at the end (window), the least round trip of a batch of late (path rtt),
// the mean and the longest round trip of the batches over the run (batch
// rtt, batch max), and the share of those
// settlements that waited for a batch on its way to come back (queued),
// with the mean and longest wait of those. The table follows an empty
// line, to come under another; WriteHealth writes nothing if no report has
// a Health.
func WriteHealth(w io.Writer, reports []Report) error {
	some := false
	for _, r := range reports {
		some = some || r.Health != nil
	}
	if !some {
		return nil
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, healthHeader+"\t")
	for _, r := range reports {
		h := r.Health
		if h == nil {
			continue
		}
		mean, longest := "-", "-"
		if h.Rounds > 0 {
			mean, longest = fmtDuration(h.RoundTripSum/time.Duration(h.Rounds)), fmtDuration(h.RoundTripMax)
		}
		batch, window, path, brtt, bmax := "-", "-", "-", "-", "-"
		if h.Batches > 0 {
			batch = fmt.Sprintf("%.1f", float64(h.Batched)/float64(h.Batches))
		}
		if h.Window > 0 {
			window = fmt.Sprint(h.Window)
		}
		if h.PathRTT > 0 {
			path = fmtDuration(h.PathRTT)
		}
		if h.BatchTrips > 0 {
			brtt, bmax = fmtDuration(h.BatchTripSum/time.Duration(h.BatchTrips)), fmtDuration(h.BatchTripMax)
		}
		queued, wait, waitMax := "-", "-", "-"
		if h.Batched > 0 {
			queued = fmt.Sprintf("%.1f%%", 100*float64(h.Queued)/float64(h.Batched))
		}
		if h.Queued > 0 {
			wait, waitMax = fmtDuration(h.QueueWaitSum/time.Duration(h.Queued)), fmtDuration(h.QueueWaitMax)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Mode, mean, longest, h.RoundErrors, h.KeyErrors, h.FetchErrors, h.FetchTimeouts,
			h.Unanswered, h.HeartbeatErrors, h.ExactErrors, h.Pressured, h.Uncertain, h.Transitions, h.Opened,
			batch, window, path, brtt, bmax, queued, wait, waitMax)
	}
	return tw.Flush()
}
