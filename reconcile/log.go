package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// logEvery is the least time between two log lines about settlement rounds
// that go on failing: an outage is logged by its first failed round, then
// at most once per logEvery with the count of failed rounds, and by the
// round that succeeds again.
const logEvery = 10 * time.Second

// failing is what the log needs to know about the rounds failing in a row.
// It is owned by the loop goroutine.
type failing struct {
	rounds int           // failed in a row
	since  time.Duration // when the first of them failed, on the clock
	logged time.Duration // when a line about them was last written
}

// roundFailed logs a failed round of keys settlements, unless one was
// logged less than logEvery ago.
func (r *Reconciler) roundFailed(keys int, err error) {
	f := &r.failing
	now := r.clock.Now()
	f.rounds++
	switch {
	case f.rounds == 1:
		f.since, f.logged = now, now
		r.log.Warn("hybrid: settlement round failed; its consumption is kept for a later round",
			"keys", keys, "err", err)
	case now-f.logged >= logEvery:
		f.logged = now
		r.log.Warn("hybrid: settlement rounds still failing",
			"failed_rounds", f.rounds, "for", now-f.since,
			"unsettled_tokens", float64(r.stats.unsettled.Load())/local.Micro, "err", err)
	}
}

// roundSucceeded logs the end of a run of failed rounds, if there was one.
func (r *Reconciler) roundSucceeded() {
	f := &r.failing
	if f.rounds == 0 {
		return
	}
	r.log.Info("hybrid: settlement rounds succeed again",
		"failed_rounds", f.rounds, "for", r.clock.Now()-f.since)
	*f = failing{}
}

// logTransition logs a state change of the breaker: a warning when it opens
// (decisions that need Redis go to the fallback policy), an info line when it
// closes again, with how long it was not closed, and the probes in between
// at debug level.
//
// On a Redis Cluster the lines about a node's breaker name the node.
func (r *Reconciler) logTransition(n *node, from, to breaker.State) {
	now := r.clock.Now()
	var args []any
	if n.addr != "" {
		args = append(args, "node", n.addr)
	}
	switch {
	case from == breaker.Closed:
		if c := global.Cause(n.cause.Load()); c != global.NoCause {
			r.log.Warn("hybrid: Redis refuses every call ("+refusalText[c]+"); the fallback policy decides until it accepts them",
				append(args, "breaker", to.String(), "cause", c.String())...)
			break
		}
		r.log.Warn("hybrid: Redis unreachable; the fallback policy decides until it is back",
			append(args, "breaker", to.String())...)
	case to == breaker.Closed:
		r.log.Info("hybrid: Redis reachable again; the outage's consumption is settled",
			append(args, "breaker", to.String(), "down_for", now-time.Duration(n.openedAt.Load()))...)
	default:
		r.log.Debug("hybrid: breaker state changed", append(args, "from", from.String(), "to", to.String())...)
	}
}

// refusalText says what each cause of refusal means, in the line logged
// when a breaker opens for it.
var refusalText = [global.Causes]string{
	global.Refused:     "the client is refused: credentials or ACL",
	global.Full:        "out of memory: maxmemory reached, noeviction",
	global.ReadOnly:    "a read-only replica",
	global.MasterDown:  "a replica without its master",
	global.Unpersisted: "writes stopped: RDB snapshots fail to save, stop-writes-on-bgsave-error",
}

// logClose logs the end of Close: what it settled, and what it could not.
func (r *Reconciler) logClose(keys int, lost int64, err error) {
	if err != nil {
		r.log.Warn("hybrid: closed; the last settlement failed",
			"keys", keys, "unsettled_tokens", float64(lost)/local.Micro, "err", err)
		return
	}
	r.log.Info("hybrid: closed", "keys_settled", keys)
}
