package reconcile

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// A Redis that loses writes (a failover to a replica that had not received
// them yet, a handover whose old master took writes until it was demoted, a
// restart from an older snapshot) forgets the tokens this instance's
// settlements took out of its buckets (lease grants, exact decisions,
// charged consumption): the fleet would admit them again. So each instance
// keeps a journal of what its settlements took, key by key, for the last
// journalBeats heartbeat intervals, and its heartbeat tells when Redis last
// saw it beat (global.Limiter.HeartbeatWas). A last beat older than the one
// the instance made means Redis lost its writes since then: the instance
// charges again, as orphans at the next round, what its settlements took
// after that time. What Redis kept of those writes (between its last beat
// and the loss) is charged twice, which errs towards denying, by at most a
// heartbeat interval of this instance's settlements.

// A Redis that keeps the instance's last beat may still lack writes that
// came after it: a master that dies sends its replicas each write after it
// answers it, so the writes of its last moments (an event loop's, more on a
// slow link) may never reach the replica promoted in its place, and the
// beat before them, which the replica holds, shows nothing. So when another
// server answers after an outage that began after the last beat (on a
// Redis Cluster, another node at the master's slots; on a single Redis, a
// server of another name, see serverNamer), the instance charges again what
// its settlements took in the last lossTail before its last reply from the
// dead master, and the rest of that reply's journal slot: at most lossTail
// and a slot of this instance's settlements, once a failover, charged twice
// if the replica had them. A network that failed for a while, the same
// server answering after it, charges nothing: nothing was lost.

// lossTail is how long before the last reply a master sent ahead of an
// outage its writes may not have reached a replica: a replica's lag on a
// healthy link is the time a write takes to cross it, milliseconds.
const lossTail = 20 * time.Millisecond

// witness is implemented by a Store whose heartbeat also tells when Redis
// last saw the instance beat (*global.Limiter): the Reconciler then detects
// the loss of its writes.
type witness interface {
	HeartbeatWas(ctx context.Context, id string, ttl time.Duration) (live int, now, was time.Time, err error)
}

// serverNamer is implemented by a Store that names the Redis server that
// answers a single Redis's heartbeat (*global.Limiter: Server): a replica
// promoted in its place has another name, a connection made again to the
// same server the same one; "" if it has none.
type serverNamer interface {
	Server(ctx context.Context) (string, error)
}

// beat is a beat of a witness: the Redis time it was made at, the node
// that answered it ("" on a single Redis), and on a single Redis the name
// of the server that answered it, as last asked (see askServer; "" if not
// known).
type beat struct {
	at     time.Time
	node   string
	server string
}

// server returns the name of the server that answers a single Redis's
// heartbeat when askServer says to ask for it: "" when not asked, or when
// the server does not tell.
func (r *Reconciler) server(ctx context.Context) string {
	if !r.askServer() {
		return ""
	}
	sn := r.st.(serverNamer)
	var name string
	r.DoFleet(ctx, func(ctx context.Context) error {
		var err error
		name, err = sn.Server(ctx)
		return err
	})
	return name
}

// askServer reports whether the heartbeat just answered on a single Redis
// should ask the server's name: at the first beat, and at the first after
// an outage began, which may have been a failover behind one address (a
// Sentinel's master, a managed Redis's endpoint). A failover without an
// outage (a handover: Redis lets the replica catch up first) loses
// nothing, but leaves the name known stale: the next outage then charges
// its tail again, once, towards denying.
func (r *Reconciler) askServer() bool {
	if r.router != nil {
		return false
	}
	if _, ok := r.st.(serverNamer); !ok {
		return false
	}
	r.lossMu.Lock()
	last, asked := r.lastBeats[""], r.serverAsked
	r.serverAsked = true
	r.lossMu.Unlock()
	if !asked {
		return true
	}
	d, ok := r.outageOf(r.def)
	return ok && last.at.Before(r.clock.Time(d))
}

// witnessKept is how long Redis keeps an instance's last beat at least
// (lua/heartbeat.lua).
const witnessKept = 10 * time.Minute

// journalBeats is how many heartbeat intervals the journal covers: a loss
// is seen at the first heartbeat after it, and a heartbeat may fail or come
// late.
const journalBeats = 3

// journal is what this instance's settlements took out of each bucket
// lately, key by key (and node by node on a Redis Cluster), in slots of
// journalSlot, oldest first: a hot key settled every millisecond costs one
// entry a slot.
type journal struct {
	mu    sync.Mutex
	slots []slot
	n     int // entries over all slots
	// An outage pins the journal: what was taken from pinFrom on is kept
	// until pinUntil (Redis times in microseconds), for a failover can take
	// longer than the journal's span, and a loss is seen only once a node
	// answers again.
	pinFrom, pinUntil int64
	// spare is the map of the last slot dropped, emptied, for the next
	// slot: a long tail fills a slot's map with thousands of keys, which
	// made anew each slot, and collected, cost as much as filling it.
	spare map[string]took
}

// slot is what the settlements whose replies came in one journalSlot took,
// by key, or by key, "\x00" and node on a Redis Cluster (journalID).
type slot struct {
	start int64 // Redis time, microseconds
	took  map[string]took
}

// took is what settlements of one key took out of its bucket in a slot,
// on one node: granted plus consumed less returned, summed (net, which a
// give-back makes negative), and the most that the settlements from any
// one of them on took, at least 0 (suffix: were the writes lost from some
// point on, what they took), and the Redis time of the last. The key and
// node are its slot's map key: a long tail adds an entry a decision, so
// an entry is kept small.
type took struct {
	sp     *Spec
	at     int64 // Redis time, microseconds
	net    int64 // micro-tokens
	suffix int64 // micro-tokens
}

// journalID is the journal's map key of key on node ("" on a single
// Redis): the key itself, or the key, a zero byte and the node (a node's
// address has no zero byte; a key may).
func journalID(key, node string) string {
	if node == "" && strings.IndexByte(key, 0) < 0 {
		return key
	}
	return key + "\x00" + node
}

// splitID returns the key and node of a journal map key (journalID).
func splitID(id string) (key, node string) {
	if i := strings.LastIndexByte(id, 0); i >= 0 {
		return id[:i], id[i+1:]
	}
	return id, ""
}

const (
	// journalSlot is the time a journal slot covers.
	journalSlot = 100 * time.Millisecond
	// journalMax bounds the journal's entries (about 70 bytes each, 1.1
	// MiB in all): past it the oldest slots go first, and a loss found
	// later than they cover is charged again in part. A hot key costs an
	// entry a slot; an instance that settles more than journalMax keys
	// in three heartbeat intervals (a long tail at more than 5,000 keys a
	// second) covers less than that.
	journalMax = 1 << 14
)

// add records what s, a settlement of a key of sp on node ("" on a single
// Redis), took, as its reply rep tells (less what it gave back), and drops
// what is older than span before it. A failed settlement and a duplicate
// (whose first reply was recorded, if it came) add nothing.
func (j *journal) add(sp *Spec, node string, s *global.Settlement, rep *global.Reply, span time.Duration) {
	if rep.Err != nil || rep.Duplicate || rep.Now.IsZero() || sp == nil {
		return
	}
	// What the bucket took: a charge less what its claim took back out of
	// an outage's pool and what the debt's floor forgave. Counted in full,
	// a lost charge whose claim Redis credited was charged again beyond
	// what the bucket had lost (a second failover after an outage).
	net := rep.Granted + s.Consumed - rep.Credited - rep.Forgiven - s.Returned
	if net == 0 {
		return
	}
	at := rep.Now.UnixMicro()
	start := at - at%journalSlot.Microseconds()
	j.mu.Lock()
	defer j.mu.Unlock()
	k := len(j.slots) - 1
	for k >= 0 && j.slots[k].start > start { // a reply older than the newest slot
		k--
	}
	if k < 0 || j.slots[k].start != start {
		if k != len(j.slots)-1 {
			return // older than the newest slot, and no slot of its own: too old to matter
		}
		// Sized as the slot before it ended: a steady flow of new keys
		// fills it without growing it step by step.
		m := j.spare
		j.spare = nil
		if m == nil {
			hint := 0
			if k >= 0 {
				hint = len(j.slots[k].took)
			}
			m = make(map[string]took, hint)
		}
		j.slots = append(j.slots, slot{start: start, took: m})
		k = len(j.slots) - 1
	}
	id := journalID(s.Key, node)
	t, ok := j.slots[k].took[id]
	if !ok {
		j.n++
	}
	t.sp, t.at, t.net, t.suffix = sp, max(t.at, at), t.net+net, max(t.suffix+net, 0)
	j.slots[k].took[id] = t
	j.dropLocked(at, span, 1)
}

// len returns the entries the journal holds.
func (j *journal) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.n
}

// trim drops what the journal keeps from before span ago, now being Redis
// time in microseconds (a heartbeat's): the slots of a burst of writes go
// when they are old, not when the next write comes, which may be never.
func (j *journal) trim(now int64, span time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dropLocked(now, span, 0)
}

// dropLocked drops the oldest slots while they ended more than span before
// now (unless an outage pins them) or the journal holds more than
// journalMax entries, keeping the newest keep slots at least. j.mu is held.
func (j *journal) dropLocked(now int64, span time.Duration, keep int) {
	cut := now - span.Microseconds()
	if now < j.pinUntil {
		cut = min(cut, j.pinFrom)
	}
	drop := 0
	for drop < len(j.slots)-keep && (j.slots[drop].start+journalSlot.Microseconds() < cut || j.n > journalMax) {
		j.n -= len(j.slots[drop].took)
		if j.spare == nil {
			clear(j.slots[drop].took)
			j.spare = j.slots[drop].took
		}
		drop++
	}
	if drop > 0 {
		n := copy(j.slots, j.slots[drop:])
		clear(j.slots[n:])
		j.slots = j.slots[:n]
	}
}

// pin keeps what was taken from two spans before now on (Redis time,
// microseconds: now is when a breaker opened, after calls failed for a
// while) while an outage lasts: until unpin, and then for two spans more,
// time for a heartbeat to see a loss the outage hid.
func (j *journal) pin(now int64, span time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if now >= j.pinUntil {
		j.pinFrom = now - 2*span.Microseconds()
	}
	j.pinUntil = math.MaxInt64
}

// unpin ends the pin of an outage at now plus two spans, unless another
// outage holds it.
func (j *journal) unpin(now int64, span time.Duration, outages int32) {
	if outages > 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pinUntil = now + 2*span.Microseconds()
}

// pinned reports whether an outage pins the journal at now (Redis time,
// microseconds): one is under way, or ended less than two spans ago.
func (j *journal) pinned(now int64) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return now < j.pinUntil
}

// Took records what s, a settlement of a key of sp that a caller sent
// itself through SettleNow (an Exact decision), took out of its bucket, as
// its reply rep tells: if Redis loses that write, the instance charges it
// again (see witnessed). It counts what the settlement's charge forgave
// (Stats.Forgiven) and what an outage's pool credited (Stats.Credited).
//
// On a Redis Cluster the entry names the node the key's bucket is on now,
// which answered the settlement (unless the layout changed in between): a
// replica promoted in a master's place keeps what it answered itself.
func (r *Reconciler) Took(sp *Spec, s *global.Settlement, rep *global.Reply) {
	if rep.Forgiven > 0 {
		r.stats.forgiven.Add(uint64(rep.Forgiven))
	}
	if rep.Credited > 0 {
		r.stats.credited.Add(uint64(rep.Credited))
	}
	node := ""
	if r.router != nil && rep.Err == nil {
		node = r.router.Node(done, s.Key)
	}
	r.journal.add(sp, node, s, rep, r.journalSpan())
}

// journalSpan is how long the journal keeps what settlements took, outside
// outages.
func (r *Reconciler) journalSpan() time.Duration { return journalBeats * r.cfg.HeartbeatInterval }

// since returns, key by key, what the settlements whose last reply of a
// slot came at or after at (Redis time, microseconds) took in that slot,
// up to the slot that holds until, with the key's spec, of the entries of
// the keys and nodes keep is true for: a slot's settlements before at, or
// after until, are counted too, towards denying.
// Each key's suffix (its net is not summed) is the most its settlements
// took from any one of them on: what Redis lacks if it lost them from there on. A give-back after a
// grant lowers it only where both were lost; a give-back whose grant Redis
// kept is not given back again (towards denying: it may have kept the
// give-back too).
func (j *journal) since(at, until int64, keep func(key, node string) bool) map[string]took {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make(map[string]took)
	for _, sl := range j.slots { // oldest first
		if sl.start > until {
			break
		}
		for id, t := range sl.took {
			if key, node := splitID(id); t.at >= at && keep(key, node) {
				sum := out[key]
				sum.sp, sum.suffix = t.sp, max(t.suffix, sum.suffix+t.net)
				out[key] = sum
			}
		}
	}
	return out
}

// latest returns the Redis time (microseconds) of the last reply the
// journal holds, at or before until, of the entries keep is true for: 0 if
// none.
func (j *journal) latest(until int64, keep func(key, node string) bool) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var last int64
	for _, sl := range j.slots {
		if sl.start > until {
			break
		}
		for id, t := range sl.took {
			if t.at > last && t.at <= until {
				if key, node := splitID(id); keep(key, node) {
					last = t.at
				}
			}
		}
	}
	return last
}

// witnessed handles a heartbeat's reply: Redis's time now and when it last
// saw this instance beat (zero: never). On a Redis Cluster it witnesses the
// node of the fleet count alone; witnessNodes the others.
func (r *Reconciler) witnessed(now, was time.Time, server string) {
	on := ""
	if r.router != nil {
		on = r.router.FleetNode(done)
	}
	r.witnessedOn("", on, server, now, was)
}

// witnessedOn handles the reply of a beat of witness w ("" for the
// heartbeat's, else a node's probe key) that the node at addr answered ("":
// a single Redis, or a node not known): Redis's time now and the beat
// before it that the node held (zero: none). A beat older than this
// instance's last of w, or none when the node should still hold it, means
// the node lost the writes since: what the journal says this instance's
// settlements took after then is charged again. On a Redis Cluster that is
// what they took of the keys addr holds now; and if another node answered
// the last beat (addr is a replica that took its place), only what that
// other node answered: what the replica answered once promoted, the charges
// of the outage's admissions among them, it holds. With addr "", every
// key's.
func (r *Reconciler) witnessedOn(w, addr, server string, now, was time.Time) {
	r.lossMu.Lock()
	last := r.lastBeats[w]
	if !now.After(last.at) {
		r.lossMu.Unlock()
		return // an older beat than one handled already
	}
	if r.lastBeats == nil {
		r.lastBeats = make(map[string]beat)
	}
	if server == "" {
		server = last.server // not asked this beat
	}
	r.lastBeats[w] = beat{at: now, node: addr, server: server}
	r.lossMu.Unlock()
	if last.at.IsZero() {
		return // the first beat: nothing to compare
	}
	var since time.Time
	all, tail := false, false
	// Another node answers: a replica took the place of last.node (on a
	// single Redis, of the server that answered last.at).
	moved := last.node != addr || last.server != "" && server != last.server
	switch {
	case was.IsZero() && now.Sub(last.at) < witnessKept:
		// The node lost this instance's last beat, which it would still
		// hold: it lost its data, every bucket as much. What the journal
		// holds of the time before is charged again, all of it, though the
		// buckets, full again, lost only what took them below full: so
		// down to -burst at most. That holds exactly what was lost while
		// the bucket held 0 or more when it was lost: what its writes took
		// since then, from a full bucket, is no more than burst and its
		// refill.
		all = true
	case !was.IsZero() && was.Before(last.at):
		since = was
	case !was.IsZero() && moved:
		// The node kept the last beat, but it is a replica promoted in
		// the place of the master that answered it. If that master died
		// in an outage that began after the beat, it may not have sent
		// the replica the writes of its last moments: no beat shows
		// that.
		since, tail = was, true
	default:
		return
	}
	// What the instance wrote after the node's last outage began went to
	// the Redis that answers now (a replica promoted meanwhile: the writes
	// it lacks were made before), if this is the first beat it answers
	// since: only what came before can be lost. Not if a beat after the
	// outage's start was answered and is lost now: the Redis that took it
	// lost what came after it too (Sentinel failing over a second time, to
	// a replica that lagged behind the first it promoted).
	until := int64(math.MaxInt64)
	n := r.def
	if addr != "" {
		if m, ok := (*r.nodes.Load())[addr]; ok {
			n = m
		}
	}
	if d, ok := r.outageOf(n); ok {
		if began := r.clock.Time(d); last.at.Before(began) {
			until = began.UnixMicro()
		}
	}
	keep := func(key, node string) bool {
		return addr == "" || r.router.Node(done, key) == addr && (!moved || node != addr)
	}
	if tail {
		if until == math.MaxInt64 {
			return // no outage since the last beat: a replica that took over lacks nothing this instance wrote
		}
		lastReply := r.journal.latest(until, keep)
		if lastReply == 0 {
			return
		}
		since = time.UnixMicro(max(since.UnixMicro(), lastReply-lossTail.Microseconds()))
	}
	lost := r.journal.since(since.UnixMicro(), until, keep)
	var keys int
	var tokens int64
	for key, t := range lost {
		if t.suffix > 0 {
			// A total loss's charge stops at -burst (see above).
			r.mergeOrphan(key, orphan{spec: t.sp, consumed: t.suffix, shallow: all})
			keys++
			tokens += t.suffix
		}
	}
	r.stats.recharged.Add(uint64(tokens))
	if tail {
		r.stats.tails.Add(1)
		r.log.Info("hybrid: Redis answers again after an outage; charging again what this instance took in its last moments before it, which a replica promoted meanwhile may lack",
			slog.String("node", addr), slog.Time("since", since), slog.Time("until", time.UnixMicro(until)), slog.Int("keys", keys), slog.Float64("tokens", float64(tokens)/1e6))
		return
	}
	r.stats.losses.Add(1)
	r.log.Warn("hybrid: Redis lost writes (a failover to a replica that lagged, or a restart); charging again what this instance took since",
		slog.String("node", addr), slog.Time("since", since), slog.Time("until", time.UnixMicro(until)), slog.Int("keys", keys), slog.Float64("tokens", float64(tokens)/1e6))
}

// forgetWitnesses drops the last beats of the node witnesses not in keep.
func (r *Reconciler) forgetWitnesses(keep map[string]bool) {
	r.lossMu.Lock()
	defer r.lossMu.Unlock()
	for w := range r.lastBeats {
		if w != "" && !keep[w] {
			delete(r.lastBeats, w)
		}
	}
}
