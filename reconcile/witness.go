package reconcile

import (
	"context"
	"log/slog"
	"maps"
	"time"
)

// On a Redis Cluster the heartbeat reaches one master, the one that holds
// the fleet count, and its witness (see witnessed) tells when that master
// lost this instance's writes. Every other master this instance settles
// keys on keeps a witness of its own, beside the bucket of the key whose
// lookup made the node (its probe): a failover to a replica that lagged
// behind that master is seen at the next heartbeat, and what the journal
// holds of that master's keys is charged again. The probe key stays in its
// slot when a replica takes the master's place, so the beat that finds the
// loss is the first one the new master answers.

// nodeWitness is implemented by a Store that keeps an instance's last beat
// beside the bucket of a key, on the node of that bucket (*global.Limiter).
type nodeWitness interface {
	Witness(ctx context.Context, key, id string, ttl time.Duration) (now, was time.Time, err error)
	Unwitness(ctx context.Context, key, id string) error
}

// witnessNodes beats, on a Redis Cluster, on every node this instance
// settles keys on besides the fleet count's, each through the breaker of
// the node that holds its probe key now, and charges again what a node
// lost. Then it retires the nodes whose breaker is not closed and whose
// keys another node answered for: a replica took their place. fleetOK says
// whether the heartbeat, which answers for the fleet count's node, was
// answered.
func (r *Reconciler) witnessNodes(ctx context.Context, fleetOK bool) {
	if r.router == nil {
		return
	}
	w, canWitness := r.st.(nodeWitness)
	fleet := r.router.FleetNode(done)
	nodes := *r.nodes.Load()
	answered := make(map[string]string, len(nodes)) // probe key -> the node that answered for it
	probes := make(map[string]bool, len(nodes))     // the probe keys in use
	for _, n := range nodes {
		if n.probe == "" || probes[n.probe] {
			continue
		}
		probes[n.probe] = true
		at := r.router.Node(done, n.probe)
		if at == "" || at == fleet || !canWitness {
			// Not known, or the fleet count's node, whose heartbeat
			// witnesses it.
			if at != "" && fleetOK {
				answered[n.probe] = at
			}
			continue
		}
		var now, was time.Time
		err := r.call(ctx, r.node(at, n.probe, false), 1, func(ctx context.Context) error {
			var err error
			now, was, err = w.Witness(ctx, n.probe, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval)
			return err
		})
		if err != nil {
			continue
		}
		answered[n.probe] = at
		r.witnessedOn(n.probe, at, "", now, was)
	}
	r.forgetWitnesses(probes)
	for addr, n := range nodes {
		other := answered[n.probe]
		if n.probe == "" {
			other = ""
			if n.fleet && fleetOK {
				other = fleet
			}
		}
		if other != "" && other != addr && n.degraded.Load() {
			r.retire(n, other)
		}
	}
}

// retire drops node n, whose breaker is not closed and whose keys the node
// at other answers for now: its breaker no longer counts in Degraded and
// Stats, and should its address serve keys again, it gets a node anew. Its
// outage still marks the settlements of the nodes new to this instance for
// outageMark (see outageOf), as a breaker that closes marks its own: the
// first write on the replica that took its place may come after this, and
// must keep the refill the bucket lost for the fleet's outage charges.
func (r *Reconciler) retire(n *node, other string) {
	r.nodeMu.Lock()
	if m := *r.nodes.Load(); m[n.addr] == n {
		next := maps.Clone(m)
		delete(next, n.addr)
		r.nodes.Store(&next)
	}
	r.nodeMu.Unlock()
	n.mu.Lock()
	n.retired = true
	if n.degraded.Swap(false) {
		raise(&n.markUntil, &r.markUntil, int64(r.clock.Now()+outageMark))
		r.journal.unpin(r.clock.Time(r.clock.Now()).UnixMicro(), r.journalSpan(), r.ndegraded.Add(-1))
	}
	n.mu.Unlock()
	r.log.Info("hybrid: Redis node retired: another node holds its keys now", slog.String("node", n.addr), slog.String("by", other))
}

// unwitness deletes this instance's witnesses on the nodes of a Redis
// Cluster, as it leaves the fleet: a node that does not answer keeps its
// witness until it expires (witnessKept), which harms nothing.
func (r *Reconciler) unwitness(ctx context.Context) {
	w, ok := r.st.(nodeWitness)
	if r.router == nil || !ok {
		return
	}
	seen := make(map[string]bool)
	for _, n := range *r.nodes.Load() {
		if n.probe == "" || seen[n.probe] || n.degraded.Load() {
			continue
		}
		seen[n.probe] = true
		w.Unwitness(ctx, n.probe, r.cfg.InstanceID)
	}
}
