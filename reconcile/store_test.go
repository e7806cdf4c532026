package reconcile_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

const M = local.Micro

// store is an in-memory Store: the settlement arithmetic of the script with
// no refill (the tests set the tokens they need), a fleet count, a log of
// calls, and a switch that makes every call fail.
type store struct {
	mu      sync.Mutex
	tokens  map[string]int64 // missing: full
	settles int              // Settle calls
	keys    int              // settlements applied
	fail    error
	beats   int
	live    int
	left    bool
	gate    chan struct{}       // if not nil, Settle waits for it
	entered int                 // Settle calls begun, at the gate or past it
	lost    error               // if not nil, Settle applies the batch, then fails with it (a reply lost)
	recs    map[string][2]int64 // key + " " + instance: the last seq applied and its grant
	dups    int                 // settlements found to be duplicates
	seqs    map[string][]int64  // the seqs each key was sent, in order
	sizes   []int               // the settlements of each Settle call past the gate
	delay   time.Duration       // how long each Settle call takes past the gate (a round trip)
	// work, if not 0, is how long Redis runs each settlement of a call,
	// one call at a time (server), after half of delay: a busy Redis.
	work   time.Duration
	server chan struct{}
	// supersede, if set, answers every settlement with a seq as the script
	// answers one superseded since (a later seq of its instance applied):
	// a duplicate granted nothing, not applied.
	supersede bool
	claims    map[string]int64 // key: the claims of the settlements applied (global.Settlement.Claim)
	credit    bool             // claims are credited in full, as out of an outage's pool
	marked    map[string]int   // key: the settlements applied that carried an outage's start (global.Settlement.Since)
}

func newStore() *store {
	return &store{tokens: map[string]int64{}, live: 1, recs: map[string][2]int64{}, seqs: map[string][]int64{}, claims: map[string]int64{}, marked: map[string]int{}}
}

func (s *store) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	s.mu.Lock()
	s.entered++
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	delay, work := s.delay, s.work
	if work > 0 && s.server == nil {
		s.server = make(chan struct{}, 1)
	}
	server := s.server
	s.mu.Unlock()
	if work > 0 {
		time.Sleep(delay / 2)
		server <- struct{}{} // a channel, not a mutex: synctest sees it blocked
		time.Sleep(time.Duration(len(batch)) * work)
		<-server
		delay -= delay / 2
	}
	if delay > 0 {
		time.Sleep(delay) // in a synctest bubble: a round trip of fake time
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settles++
	s.sizes = append(s.sizes, len(batch))
	if s.fail != nil {
		for i := range batch {
			replies[i] = global.Reply{Err: s.fail}
		}
		return s.fail
	}
	for i, st := range batch {
		b := st.Limit.Burst
		t, ok := s.tokens[st.Key]
		if !ok {
			t = b
		}
		rk := st.Key + " " + st.Instance
		if st.Seq > 0 {
			s.seqs[st.Key] = append(s.seqs[st.Key], st.Seq)
		}
		if s.supersede && st.Seq > 0 {
			s.dups++
			replies[i] = global.Reply{Tokens: t, Now: time.Now(), Duplicate: true, Superseded: true}
			continue
		}
		if rec, ok := s.recs[rk]; ok && st.Seq > 0 && st.Seq <= rec[0] {
			// Applied already, as the script tells.
			g := int64(0)
			if st.Seq == rec[0] {
				g = rec[1]
			}
			s.dups++
			replies[i] = global.Reply{Granted: g, Tokens: t, Now: time.Now(), Duplicate: true, Superseded: st.Seq < rec[0]}
			continue
		}
		s.claims[st.Key] += st.Claim
		if !st.Since.IsZero() {
			s.marked[st.Key]++
		}
		var credited int64
		if s.credit {
			credited = st.Claim
		}
		t = min(b, t+st.Returned)
		t = max(-b, t-(st.Consumed-credited))
		g := min(st.Want, max(t, 0))
		g -= g % max(st.Quantum, 1)
		if g < st.MinGrant {
			g = 0
		}
		t -= g
		s.tokens[st.Key] = t
		if st.Seq > 0 {
			s.recs[rk] = [2]int64{st.Seq, g}
		}
		s.keys++
		replies[i] = global.Reply{Granted: g, Tokens: t, Now: time.Now(), Credited: credited}
	}
	if s.lost != nil {
		for i := range batch {
			replies[i] = global.Reply{Err: s.lost}
		}
		return s.lost
	}
	return nil
}

func (s *store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, time.Time{}, s.fail
	}
	s.beats++
	return s.live, time.Now(), nil
}

func (s *store) Leave(ctx context.Context, id string, ttl time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left = true
	return s.live - 1, s.fail
}

func (s *store) get(key string) (tokens int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tokens, ok = s.tokens[key]
	return tokens, ok
}

func (s *store) set(f func(s *store)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

func (s *store) counts() (settles, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settles, s.keys
}

func newReconciler(t *testing.T, st reconcile.Store, cfg reconcile.Config) *reconcile.Reconciler {
	t.Helper()
	r, err := reconcile.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func spec(t *testing.T, rate float64, burst int64, m reconcile.Mode) *reconcile.Spec {
	t.Helper()
	sp, err := reconcile.NewSpec(rate, burst, m)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// neverOpens is a breaker policy that never opens: for tests whose calls
// fail on purpose, round after round.
var neverOpens = breaker.Config{ConsecutiveFailures: 1 << 30, FailureRatio: 1, MinRequests: 1 << 30}

// entry adds key to r's store with spec sp.
func entry(r *reconcile.Reconciler, key string, sp *reconcile.Spec) *reconcile.Entry {
	e, _ := r.Keys().GetOrAdd(key)
	e.X.SetSpec(sp)
	return e
}
