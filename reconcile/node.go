package reconcile

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
)

// Router is implemented by a Store whose buckets may be spread over several
// Redis nodes, as on a Redis Cluster: it names the node that holds a key's
// bucket, so that every node has a breaker of its own and one node failing
// sends only its own keys to the fallback. *global.Limiter implements it.
type Router interface {
	// Spread reports whether the buckets may be on several nodes: if not,
	// the other methods are not called.
	Spread() bool
	// Node returns the address of the node that holds the bucket of key,
	// or "" if the buckets are not spread (a single Redis) or the node is
	// not known. It may ask Redis for the cluster's layout the first time,
	// within ctx, and must return at once once it knows it.
	Node(ctx context.Context, key string) string
	// FleetNode is Node for the key of the fleet count.
	FleetNode(ctx context.Context) string
}

// relayouter is implemented by a Router that can be asked to load the
// layout of the nodes again (*global.Limiter: Relayout), when a node's
// breaker opens: a replica may be taking its place.
type relayouter interface{ Relayout() }

// node is one Redis node as the reconciler sees it: the breaker around the
// calls to it. The node of address "" stands for a single Redis, and for the
// keys whose node is not known.
type node struct {
	addr string
	// probe is the key whose lookup made the node: the node's witness is
	// kept beside its bucket (witness.go). It is "" for the node made for
	// the fleet count (fleet true), whose witness the heartbeat keeps, and
	// for one made for a key starting with '}', whose bucket's slot a
	// witness cannot share (global.Limiter.WitnessKey).
	probe    string
	fleet    bool
	br       *breaker.Breaker
	mu       sync.Mutex   // serialises the breaker's state changes with retire
	retired  bool         // another node answers for its keys now (retire), under mu
	degraded atomic.Bool  // the breaker is not closed: decide locally
	openedAt atomic.Int64 // clock reading when the breaker left the closed state
	// stretchAt is openedAt of the outage that began the node's stretch of
	// fallback decisions: an outage that opens while the last one's settle
	// rounds still run goes on with its stretch (see OutageFrom).
	stretchAt atomic.Int64
	// settleUntil is the clock reading until which the node's keys are
	// still decided locally after its breaker closed again (see settleUp).
	settleUntil atomic.Int64
	// markUntil is the clock reading until which the node's settlements
	// still carry the outage's start after its breaker closed (see
	// markOutage).
	markUntil atomic.Int64
	// cause is the global.Cause of the last call to the node that it
	// refused, NoCause once a call succeeds or its breaker closes: why
	// the node refuses every call alike, if it does (see refused).
	cause atomic.Int32
	batch batcher // the settlements requests need now (SettleNow)
}

// NodeState is the state of the breaker of one Redis node.
type NodeState struct {
	// Addr is the node's address, as the Redis client names it.
	Addr string
	// Breaker is the state of the node's breaker now.
	Breaker breaker.State
	// Cause is why the node refused the last call it refused as it
	// refuses every call alike (a full Redis, a read-only replica, a
	// refused client: see global.CauseOf) since a call last succeeded;
	// NoCause if none was, or once the breaker closes.
	Cause global.Cause
	// Window is how many batches of requests (fetches, takes, exact
	// decisions) may be on their way to the node at once now: it opens
	// while the network is most of a round trip, and stays at 1 (2 for
	// an instance alone) while Redis's work is; 0 before the node's
	// first batch.
	Window int
	// PathRTT is the least round trip of the node's batches of late (the
	// last 10 to 20 seconds): the network and a call's fixed costs, which
	// the window is sized against; 0 before the first batch came back.
	PathRTT time.Duration
	// BatchRTT is the smoothed round trip of the node's batches: PathRTT
	// plus Redis's work on a batch and the queueing, at Redis or for
	// the machine's cores, that the window keeps small.
	BatchRTT time.Duration
}

// newNode returns the node of addr with a breaker of its own, configured as
// Config.Breaker. Its state changes are counted, logged and passed on to
// Config.Breaker.OnStateChange.
func (r *Reconciler) newNode(addr, probe string, fleet bool) (*node, error) {
	if strings.HasPrefix(probe, "}") {
		probe = ""
	}
	n := &node{addr: addr, probe: probe, fleet: fleet}
	bc := r.cfg.Breaker
	if addr != "" {
		name := bc.Name
		if name == "" {
			name = breaker.DefaultName
		}
		bc.Name = name + " " + addr
	}
	user := bc.OnStateChange
	bc.OnStateChange = func(from, to breaker.State) {
		if from == breaker.Closed {
			// Before the node reads as degraded: the fallback's first
			// decision of the outage reads when it began (see
			// OutageFrom), and would take an earlier outage's for it.
			now := r.clock.Now()
			if !r.settling(n.settleUntil.Load()) {
				n.stretchAt.Store(int64(now))
			}
			n.openedAt.Store(int64(now))
			r.lastOpened.Store(int64(now))
		}
		n.mu.Lock()
		if !n.retired {
			if to == breaker.Closed && from != breaker.Closed {
				r.settleUp(n)
				n.cause.Store(int32(global.NoCause))
			}
			if was := n.degraded.Swap(to != breaker.Closed); was != (to != breaker.Closed) {
				now := r.clock.Time(r.clock.Now()).UnixMicro()
				if was {
					r.journal.unpin(now, r.journalSpan(), r.ndegraded.Add(-1))
				} else {
					r.ndegraded.Add(1)
					r.journal.pin(now, r.journalSpan())
				}
			}
		}
		n.mu.Unlock()
		if rl, ok := r.router.(relayouter); ok && to == breaker.Open && addr != "" {
			rl.Relayout() // a replica may be taking the node's slots over
		}
		r.stats.countTransition(from, to)
		r.logTransition(n, from, to)
		if user != nil {
			user(from, to)
		}
	}
	var err error
	if n.br, err = breaker.New(bc); err != nil {
		return nil, err
	}
	return n, nil
}

// done is a context that has ended: a lookup under it never waits.
var done = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// nodeOf returns the node that holds the bucket of key. It asks the Router,
// which may load the cluster's layout within ctx the first time; a key
// whose node is not known goes to the default node.
func (r *Reconciler) nodeOf(ctx context.Context, key string) *node {
	if r.router == nil {
		return r.def
	}
	return r.node(r.router.Node(ctx, key), key, false)
}

// node returns the node of addr, made the first time it is asked for, with
// probe (a key it holds) as its probe, or for the fleet count if fleet.
func (r *Reconciler) node(addr, probe string, fleet bool) *node {
	if addr == "" {
		return r.def
	}
	if n, ok := (*r.nodes.Load())[addr]; ok {
		return n
	}
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	m := *r.nodes.Load()
	if n, ok := m[addr]; ok {
		return n
	}
	n, err := r.newNode(addr, probe, fleet)
	if err != nil { // the config was checked by New: not reached
		return r.def
	}
	next := make(map[string]*node, len(m)+1)
	for a, v := range m {
		next[a] = v
	}
	next[addr] = n
	r.nodes.Store(&next)
	return n
}

// Gone tells the breaker of the node at addr ("" for a single Redis, or
// the default node) that the network said the node is gone: a dial to it
// refused, say (see breaker.Breaker.Gone). A node not known yet has no
// breaker to tell: its calls, when they come, make their own evidence.
func (r *Reconciler) Gone(addr string) {
	n := r.def
	if addr != "" && r.router != nil {
		m, ok := (*r.nodes.Load())[addr]
		if !ok {
			return
		}
		n = m
	}
	n.br.Gone()
}

// nodeStates returns the state of every node's breaker, sorted by address:
// the default node (address "") first, then those of a Redis Cluster.
func (r *Reconciler) nodeStates() []NodeState {
	m := *r.nodes.Load()
	s := make([]NodeState, 0, len(m)+1)
	s = append(s, r.def.state())
	for _, n := range m {
		s = append(s, n.state())
	}
	slices.SortFunc(s[1:], func(a, b NodeState) int { return strings.Compare(a.Addr, b.Addr) })
	return s
}

// state returns the state of n's breaker and batches.
func (n *node) state() NodeState {
	n.batch.mu.Lock()
	w := n.batch.win
	n.batch.mu.Unlock()
	return NodeState{Addr: n.addr, Breaker: n.br.State(), Cause: global.Cause(n.cause.Load()), Window: w.size, PathRTT: w.base, BatchRTT: w.srtt}
}

// worst returns the state of the breaker that is furthest from closed: open
// if any is, else half-open if any is, else closed.
func worst(s []NodeState) breaker.State {
	w := breaker.Closed
	for _, n := range s {
		if n.Breaker == breaker.Open || n.Breaker == breaker.HalfOpen && w == breaker.Closed {
			w = n.Breaker
		}
	}
	return w
}

// Degraded reports whether the breaker of some Redis node is open or
// probing, or closed again too lately for the fleet to have settled up (see
// settleUp): decisions for that node's keys that need Redis are then made
// locally, by the fallback policy. On a single Redis there is one breaker.
func (r *Reconciler) Degraded() bool {
	return r.ndegraded.Load() > 0 || r.settling(r.settleUntil.Load())
}

// settling reports whether the clock has not reached until yet, reading it
// only for a node that ever settled up (until not 0).
func (r *Reconciler) settling(until int64) bool {
	return until != 0 && int64(r.clock.Now()) < until
}

// DegradedKey reports whether the breaker of the node that holds key's
// bucket is open or probing, or closed again too lately for the fleet to
// have settled up, as far as known without waiting: a key whose node is not
// known yet is not degraded (its first call finds out).
func (r *Reconciler) DegradedKey(key string) bool {
	if r.ndegraded.Load() == 0 && !r.settling(r.settleUntil.Load()) {
		return false // every breaker is closed and settled: no lookup
	}
	n := r.nodeOf(done, key)
	return n.degraded.Load() || r.settling(n.settleUntil.Load())
}

// settleUp keeps the keys of node n, whose breaker just closed again, with
// the fallback policy for settleRounds more rounds: the rounds of every
// instance charge what the fallback admitted meanwhile, and a lease granted
// before they have would come out of a bucket that does not hold their
// charges yet (one the outage left full, however much the fleet spent).
func (r *Reconciler) settleUp(n *node) {
	now := r.clock.Now()
	raise(&n.settleUntil, &r.settleUntil, int64(now+settleRounds*r.cfg.SyncInterval))
	raise(&n.markUntil, &r.markUntil, int64(now+outageMark))
}

// raise sets a node's deadline to until, and the reconciler's, the latest
// of its nodes', to until if that is later.
func raise(node, all *atomic.Int64, until int64) {
	node.Store(until)
	for {
		old := all.Load()
		if until <= old || all.CompareAndSwap(old, until) {
			return
		}
	}
}

// outageMark is how long after its breaker closed a node's settlements
// still carry the start of its outage (see markOutage): time for the other
// instances of the fleet, whose breakers close at their own probes, to
// charge what their fallback admitted.
const outageMark = 5 * time.Second

// settleRounds is how many rounds the fallback keeps deciding after a
// breaker closes: the instances' breakers close within a round or so of
// one another, and each settles at its next round.
const settleRounds = 2

// OutageFrom returns the clock reading from which a fallback decision of
// key belongs to the outage it is made in, its local bucket going on
// rather than starting anew: gap before the breaker of key's node opened,
// while it is open or the outage's rounds settle (see settleUp), and never
// before an earlier outage's settle rounds ended, whose decisions were that
// outage's; an outage that opens while the last one's settle rounds run
// goes on with the last one's stretch of decisions. While the breaker is
// closed (a call failed and it has not opened yet), gap before now: the
// outage to come is the decision's. A key whose own calls fail while the
// breaker stays closed (a wrong type, say) so starts a share anew after a
// gap of its requests, from its view or the ledger.
func (r *Reconciler) OutageFrom(key string, now, gap time.Duration) time.Duration {
	n := r.nodeOf(done, key)
	began, until := time.Duration(n.stretchAt.Load()), time.Duration(n.settleUntil.Load())
	if !n.degraded.Load() && !r.settling(int64(until)) {
		return max(now-gap, until)
	}
	if until < began { // a stretch begun since the last one's rounds ended
		return max(began-gap, until)
	}
	return began - gap
}

// Do calls f through the breaker of the node that holds key's bucket, as
// breaker.Breaker.Do does: the way a decision that needs Redis (an exact
// limit) makes its call.
func (r *Reconciler) Do(ctx context.Context, key string, f func(ctx context.Context) error) error {
	n := r.def
	if r.router != nil {
		lctx, cancel := context.WithTimeout(ctx, r.callTimeout)
		n = r.nodeOf(lctx, key)
		cancel()
	}
	return r.call(ctx, n, 1, f)
}

// DoFleet calls f through the breaker of the node that holds the fleet's
// count (on a single Redis, the one breaker), as Do does for a key.
func (r *Reconciler) DoFleet(ctx context.Context, f func(ctx context.Context) error) error {
	n := r.def
	if r.router != nil {
		lctx, cancel := context.WithTimeout(ctx, r.callTimeout)
		n = r.node(r.router.FleetNode(lctx), "", true)
		cancel()
	}
	return r.call(ctx, n, 1, f)
}

// calls counts the round trips to Redis under way in this process, of
// every Reconciler (see Busy).
var calls atomic.Int32

// call makes f, a round trip to node n that carries keys settlements (1
// for a heartbeat), through n's breaker, whose deadline for it adapts to
// the latency of the calls before (breaker.Breaker.DoN), counted in calls
// while it is under way. The cause of a failure is kept (see refused)
// before the breaker counts it, so that the line logged when it opens
// names it.
func (r *Reconciler) call(ctx context.Context, n *node, keys int, f func(ctx context.Context) error) error {
	calls.Add(1)
	defer calls.Add(-1)
	return n.br.DoN(ctx, keys, func(ctx context.Context) error {
		err := f(ctx)
		r.refused(n, err)
		return err
	})
}

// refused keeps the cause of err, the error of a call to node n, as the
// node's, and counts it, if it is one (global.CauseOf); a call that
// succeeded while the breaker is closed clears the node's. A call that
// failed otherwise (no reply in time, say, on a loaded host) leaves it as
// it was.
func (r *Reconciler) refused(n *node, err error) {
	if err == nil {
		// Not while the breaker is open: a call sent before it opened,
		// or one that writes nothing, may still succeed.
		if n.cause.Load() != int32(global.NoCause) && !n.degraded.Load() {
			n.cause.Store(int32(global.NoCause))
		}
		return
	}
	if c := global.CauseOf(err); c != global.NoCause {
		n.cause.Store(int32(c))
		r.stats.refusals[c].Add(1)
	}
}

// Busy reports whether a round trip to Redis is under way in this process,
// for this Reconciler or another: a settlement round, a fetch, a heartbeat,
// an Exact call. A caller that is denied here and is about to ask again
// should then yield the processor now and then: the goroutine that waits
// for the reply, which may be what ends its denial, needs a core when the
// reply comes, and so do those of the other Limiters of the process, which
// the caller starves as much.
func Busy() bool { return calls.Load() > 0 }

// Breaker returns the circuit breaker around the calls to a single Redis,
// and on a Redis Cluster around those whose node is not known; each node of
// a Cluster has a breaker of its own besides (see Stats.Nodes).
func (r *Reconciler) Breaker() *breaker.Breaker { return r.def.br }
