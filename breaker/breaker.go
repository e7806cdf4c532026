// Package breaker is the circuit breaker around the limiter's Redis round
// trips: sony/gobreaker v2 with this project's policy on which outcomes count,
// when to trip, and how state changes are reported.
//
// A call counts as a failure when Redis failed or did not answer within the
// call's own deadline. It does not count at all when the caller gave up
// first (its context was cancelled or its own deadline passed), nor when it
// ran out of time while Redis answered other calls of the breaker, or before
// Redis had answered none of them for Config.MaxCallTimeout: a busy Redis is
// not a failed one. It counts as a success when Redis answered, even with an
// error reply (see Answered). An open breaker refuses calls: the limiter
// then runs in its local fallback mode.
//
// Silence is not the only word on a failed Redis: the network may say that
// it is gone (a connection refused, a dial reset), and whoever sees it
// tells the breaker (Gone). The calls under way then end at once, and every
// call that fails from then on until one succeeds counts as a failure,
// whatever its timing, so that a dead Redis opens the breaker within
// milliseconds of the evidence, where silence takes MaxCallTimeout.
//
// A call's deadline adapts to the latency of the calls that succeeded, as
// TCP's retransmission timeout does, between Config.CallTimeout and
// Config.MaxCallTimeout.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// State is the state of a Breaker.
type State int

// The states of a Breaker. Closed lets calls through and counts their
// outcomes; Open refuses them; HalfOpen lets a few probes through to decide
// whether to close again or re-open.
const (
	Closed State = iota
	HalfOpen
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	default:
		return fmt.Sprintf("breaker.State(%d)", int(s))
	}
}

// Defaults for the zero fields of Config.
const (
	DefaultConsecutiveFailures = 3
	DefaultFailureRatio        = 0.5
	DefaultMinRequests         = 10
	DefaultInterval            = 10 * time.Second
	DefaultOpenTimeout         = time.Second
	DefaultHalfOpenProbes      = 1
	DefaultCallTimeout         = 50 * time.Millisecond
	DefaultMaxCallTimeout      = 500 * time.Millisecond
	DefaultName                = "redis"
)

// intervalBuckets is the number of buckets of the closed state's rolling
// window: its counts age out one tenth of Interval at a time.
const intervalBuckets = 10

// Config configures a Breaker. A zero field means its documented default, so
// the zero Config is ready to use.
type Config struct {
	// ConsecutiveFailures trips the breaker when this many calls in a row
	// have failed within Interval, in the closed state. 0 means 3.
	ConsecutiveFailures uint32

	// FailureRatio trips the breaker when at least this share of the calls
	// with an outcome within Interval failed, once there are MinRequests of
	// them, in the closed state. It must be in (0, 1]. 0 means 0.5.
	FailureRatio float64

	// MinRequests is how many calls with an outcome (successes and failures;
	// not excluded calls nor calls still in flight) the FailureRatio rule
	// needs within Interval. 0 means 10.
	MinRequests uint32

	// Interval is the closed state's counting window. It rolls: counts age
	// out one tenth of Interval at a time. It must not be negative. 0 means
	// 10s.
	Interval time.Duration

	// OpenTimeout is how long the breaker stays open before it lets probes
	// through (half-open). It must not be negative. 0 means 1s.
	OpenTimeout time.Duration

	// HalfOpenProbes is how many calls the half-open breaker lets through;
	// they must all succeed for it to close, and one failure re-opens it.
	// Excluded probes (see Breaker.Do) free their place for another. 0 means 1.
	HalfOpenProbes uint32

	// CallTimeout is the least deadline of a call, set on the context
	// passed to the called function. The call fails when it expires. It
	// must not be negative. 0 means 50ms.
	CallTimeout time.Duration

	// MaxCallTimeout is the most a call's deadline grows to as it adapts to
	// the latency of the calls that succeeded (see Breaker.DoN): about
	// their mean plus four deviations, plus the work of the call's size, as
	// at least CallTimeout. A Redis slower than this is taken for failed:
	// a call that runs out of time is a failure once Redis has answered
	// none of the breaker's calls for MaxCallTimeout, and only then (calls
	// that run out of time together, in a stall shorter than that, are
	// load). It must not be negative. 0 means 500ms, or CallTimeout if that
	// is more; set it to CallTimeout for a fixed deadline, every call
	// that runs out of it while no other call succeeded being a failure.
	MaxCallTimeout time.Duration

	// OnStateChange, if not nil, is called for every state transition, in
	// the order they happen, never while a lock is held, so it may call the
	// Breaker's methods. It runs on the goroutine whose call caused the
	// transition (Do, State or Counts), unless another goroutine is
	// delivering transitions at that moment: then that one delivers it too,
	// right after the earlier ones. Calls to OnStateChange never overlap.
	// Transitions caused from inside OnStateChange are delivered after it
	// returns.
	OnStateChange func(from, to State)

	// Name names the breaker in errors. "" means "redis".
	Name string
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("breaker: invalid config")

// ErrOpen means "do not call now": the breaker is open, or it is half-open
// and its probes are in flight. Do wraps it with the breaker's name.
var ErrOpen = errors.New("breaker: open")

// Counts holds the numbers of calls and their outcomes. The first six fields
// mirror gobreaker's counts: they cover the current state only, are cleared
// on every transition, and in the closed state cover the last Interval. Trips
// and Rejected are totals since New.
type Counts struct {
	Requests             uint32 // calls let through (outcome or not yet)
	TotalSuccesses       uint32 // calls that succeeded
	TotalFailures        uint32 // calls that failed
	TotalExclusions      uint32 // calls that counted neither way
	ConsecutiveSuccesses uint32 // successes since the last failure
	ConsecutiveFailures  uint32 // failures since the last success

	Trips     uint64 // times the breaker opened
	Rejected  uint64 // calls refused with ErrOpen
	Pressured uint64 // calls that ran out of time while others succeeded, or before Redis was silent for MaxCallTimeout (excluded)
}

// Breaker is a circuit breaker. It is safe for concurrent use. Create one
// with New; the zero Breaker is not usable.
type Breaker struct {
	cb            *gobreaker.TwoStepCircuitBreaker[struct{}]
	timeouts      timeouts
	onStateChange func(from, to State)
	errOpen       error // ErrOpen with the name, when open
	errBusy       error // ErrOpen with the name, when the probes are in flight

	trips     atomic.Uint64
	rejected  atomic.Uint64
	pressured atomic.Uint64
	successes atomic.Uint64 // calls that succeeded: Redis answering
	failing   atomic.Bool   // the last call with an outcome failed
	// gone is when, on the clock of since, the network last said that
	// Redis is gone (see Gone); 0 once a call succeeds, or never said.
	gone atomic.Int64
	// cut ends the calls under way when the network says Redis is gone:
	// each call's context is cancelled with it (see Gone).
	cut atomic.Pointer[cutter]

	// quiet is when, on the clock of since, the first call since the last
	// that succeeded was made: Redis has answered nothing since. 0 means
	// no call was made since, or none yet.
	epoch time.Time
	quiet atomic.Int64

	mu         sync.Mutex   // protects the fields below; taken under gobreaker's lock, never the other way
	queue      []transition // transitions not yet delivered, from next on
	next       int          // index in queue of the next one to deliver
	delivering bool         // a goroutine is calling onStateChange
}

// cutter is a context that Gone cancels, and its cancel function.
type cutter struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newCutter() *cutter {
	ctx, cancel := context.WithCancel(context.Background())
	return &cutter{ctx: ctx, cancel: cancel}
}

// transition is one state change, queued for delivery.
type transition struct{ from, to State }

// outcome values passed to gobreaker's done callback. gobreaker classifies
// them with isExcluded and its default IsSuccessful (err == nil).
var (
	errFailure  = errors.New("breaker: failure")
	errExcluded = errors.New("breaker: excluded")
)

// New returns a Breaker configured by cfg, closed. The error wraps ErrConfig.
func New(cfg Config) (*Breaker, error) {
	switch {
	case cfg.FailureRatio != 0 && !(cfg.FailureRatio > 0 && cfg.FailureRatio <= 1):
		return nil, fmt.Errorf("%w: FailureRatio %v is not in (0, 1]", ErrConfig, cfg.FailureRatio)
	case cfg.Interval < 0:
		return nil, fmt.Errorf("%w: Interval %v is negative", ErrConfig, cfg.Interval)
	case cfg.OpenTimeout < 0:
		return nil, fmt.Errorf("%w: OpenTimeout %v is negative", ErrConfig, cfg.OpenTimeout)
	case cfg.CallTimeout < 0:
		return nil, fmt.Errorf("%w: CallTimeout %v is negative", ErrConfig, cfg.CallTimeout)
	case cfg.MaxCallTimeout < 0:
		return nil, fmt.Errorf("%w: MaxCallTimeout %v is negative", ErrConfig, cfg.MaxCallTimeout)
	}
	consecutive := orDefault(cfg.ConsecutiveFailures, DefaultConsecutiveFailures)
	ratio := orDefault(cfg.FailureRatio, DefaultFailureRatio)
	minRequests := orDefault(cfg.MinRequests, DefaultMinRequests)
	interval := orDefault(cfg.Interval, DefaultInterval)
	name := orDefault(cfg.Name, DefaultName)

	floor := orDefault(cfg.CallTimeout, DefaultCallTimeout)
	b := &Breaker{
		timeouts:      timeouts{floor: floor, ceiling: max(orDefault(cfg.MaxCallTimeout, DefaultMaxCallTimeout), floor)},
		onStateChange: cfg.OnStateChange,
		epoch:         time.Now(),
		errOpen:       &openError{msg: "breaker: " + name + ": open"},
		errBusy:       &openError{msg: "breaker: " + name + ": open (half-open, probes in flight)"},
	}
	b.cut.Store(newCutter())
	// A bucket period of a tenth of Interval (rounded up, so that gobreaker,
	// which rounds Interval up to a whole number of periods, keeps 10 of them
	// at most) makes the closed state's window roll.
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  orDefault(cfg.HalfOpenProbes, DefaultHalfOpenProbes),
		Interval:     interval,
		BucketPeriod: (interval + intervalBuckets - 1) / intervalBuckets,
		Timeout:      orDefault(cfg.OpenTimeout, DefaultOpenTimeout),
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= consecutive {
				return true
			}
			n := uint64(c.TotalSuccesses) + uint64(c.TotalFailures)
			return n >= uint64(minRequests) && float64(c.TotalFailures)/float64(n) >= ratio
		},
		OnStateChange: b.queueTransition,
		IsExcluded:    func(err error) bool { return err == errExcluded },
	})
	return b, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Do calls f unless the breaker refuses the call, in which case it returns an
// error wrapping ErrOpen without calling f. f gets a context derived from ctx
// with the breaker's call timeout for a call of size 1 (see DoN). Do
// returns f's error unchanged.
//
// The outcome counts as a success when f returns nil or an error marked with
// Answered. Otherwise, if ctx is done (the caller cancelled, or its own
// deadline passed), the call is excluded: it counts neither way, and an
// excluded half-open probe frees its place for another. So is a call whose
// own deadline expired while other calls of the breaker succeeded (Redis
// answers, but late), or that timed out before Redis had been silent for
// MaxCallTimeout, from the first call made since one last succeeded: a
// stall shorter than that, which every call under way at once runs into,
// is load (a first wave of calls on cold connections, a round of thousands
// of keys ahead of them, a busy host), not thrice a failed Redis. Both are
// pressure, counted in Counts.Pressured, unless the network said Redis is
// gone since the last call that succeeded (Gone): then the call is a
// failure, whenever it ends. Any other error, including the
// expiry of the call's deadline once Redis has answered nothing for
// MaxCallTimeout and a connection refused until the deadline, is a
// failure. The deadlines are read on the clock, not only from the
// contexts: the connection's deadline, which is the same, may end the call
// before the context's timer has fired. If f panics, the call is a failure
// and the panic goes on.
func (b *Breaker) Do(ctx context.Context, f func(ctx context.Context) error) error {
	return b.DoN(ctx, 1, f)
}

// DoN is Do for a call of size n (the keys it carries, say): its deadline
// allows for the mean latency of the calls that succeeded lately plus four
// deviations, at least CallTimeout, and for twice the work its units beyond
// the first took in them, at most MaxCallTimeout in all (see Timeout). The
// latency of a call that succeeds is learned from.
func (b *Breaker) DoN(ctx context.Context, n int, f func(ctx context.Context) error) error {
	done, err := b.cb.Allow()
	if err != nil {
		b.rejected.Add(1)
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			return b.errBusy
		}
		return b.errOpen
	}
	// Report the outcome even on a panic, or a half-open breaker would wait
	// for this probe forever.
	result := errExcluded // OnStateChange panicked: f was not called
	defer func() {
		done(result)
		b.deliver()
	}()
	b.deliver() // Allow may have moved the breaker from open to half-open

	n = max(n, 1)
	answered := b.successes.Load()
	start := time.Now()
	b.asked(start)
	callCtx, cancel := context.WithTimeout(ctx, b.timeouts.timeout(n))
	defer cancel()
	defer context.AfterFunc(b.cut.Load().ctx, cancel)()
	result = errFailure // f panicked
	err = f(callCtx)
	end := time.Now()
	switch {
	case err == nil || isAnswered(err):
		b.timeouts.observe(n, end.Sub(start))
		b.successes.Add(1)
		b.failing.Store(false)
		b.quiet.Store(0)
		b.gone.Store(0)
		result = nil
	case ended(ctx, end):
		result = errExcluded
	case b.gone.Load() != 0:
		b.failing.Store(true)
		result = errFailure
	case ended(callCtx, end) && (b.successes.Load() != answered || timedOut(err) && b.silence(end) < b.timeouts.ceiling):
		b.pressured.Add(1)
		result = errExcluded
	default:
		b.failing.Store(true)
		result = errFailure
	}
	return err
}

// Gone tells the breaker that the network said Redis is gone: a connection
// to it refused or reset while dialling, say, which a Redis that is only
// slow never makes. The calls under way end now (their contexts are
// cancelled), and each call that fails from now on, until one succeeds,
// counts as a failure, however soon it ends: a dead Redis opens the
// breaker as soon as ConsecutiveFailures calls have failed, where calls
// that only time out wait for MaxCallTimeout of silence. Gone is cheap
// and safe to call from any goroutine, a Redis client's dial hook among
// them.
func (b *Breaker) Gone() {
	b.gone.Store(b.since(time.Now()))
	b.cut.Swap(newCutter()).cancel()
}

// Answering reports whether a call through b succeeded, and the last call
// whose outcome counted did: what a caller needs before it admits on the
// strength of a charge to come, which a Redis that fails its calls, or has
// not answered one yet, may never take.
func (b *Breaker) Answering() bool { return b.successes.Load() > 0 && !b.failing.Load() }

// ended reports whether ctx is done, or its deadline has passed at now.
func ended(ctx context.Context, now time.Time) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !now.Before(d)
}

// timedOut reports whether err says that a call ran out of time (a
// context's deadline, a network timeout), not that Redis, or the network,
// refused it: a refused connection is a failure, even one that the client
// dialled again until the deadline.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// since returns t on the breaker's clock: after epoch, and never 0.
func (b *Breaker) since(t time.Time) int64 { return int64(t.Sub(b.epoch)) + 1 }

// asked notes a call made at t: the first since a call last succeeded
// starts Redis's silence, if it does not answer. (A call that succeeds
// meanwhile may end a silence that a call made just before it started:
// that call then ran into an answer, and the silence starts at the next.)
func (b *Breaker) asked(t time.Time) {
	if b.quiet.Load() == 0 {
		b.quiet.CompareAndSwap(0, b.since(t))
	}
}

// silence returns how long, at t, Redis has answered none of the calls
// made since the first after its last answer.
func (b *Breaker) silence(t time.Time) time.Duration {
	q := b.quiet.Load()
	if q == 0 {
		return 0
	}
	return time.Duration(b.since(t) - q)
}

// Timeout returns the deadline the breaker gives a call of size n now.
func (b *Breaker) Timeout(n int) time.Duration { return b.timeouts.timeout(max(n, 1)) }

// State returns the current state of the breaker. An open breaker whose
// OpenTimeout has passed becomes half-open when State, Counts or Do first
// observes it.
func (b *Breaker) State() State {
	s := b.cb.State()
	b.deliver()
	return fromGobreaker(s)
}

// Counts returns the breaker's counts, after bringing its state up to date
// as State does.
func (b *Breaker) Counts() Counts {
	b.cb.State() // rolls the closed window and times out the open state
	b.deliver()
	c := b.cb.Counts()
	return Counts{
		Requests:             c.Requests,
		TotalSuccesses:       c.TotalSuccesses,
		TotalFailures:        c.TotalFailures,
		TotalExclusions:      c.TotalExclusions,
		ConsecutiveSuccesses: c.ConsecutiveSuccesses,
		ConsecutiveFailures:  c.ConsecutiveFailures,
		Trips:                b.trips.Load(),
		Rejected:             b.rejected.Load(),
		Pressured:            b.pressured.Load(),
	}
}

// queueTransition is gobreaker's OnStateChange. gobreaker calls it with its
// own lock held, so it only records the transition; deliver runs the user's
// callback once that lock is released.
func (b *Breaker) queueTransition(_ string, from, to gobreaker.State) {
	t := transition{from: fromGobreaker(from), to: fromGobreaker(to)}
	if t.to == Open {
		b.trips.Add(1)
	}
	if b.onStateChange == nil {
		return
	}
	b.mu.Lock()
	b.queue = append(b.queue, t)
	b.mu.Unlock()
}

// deliver calls onStateChange for each queued transition, in order, unless
// another call of deliver is doing so (it then delivers these too, as it
// loops until the queue is empty). It must not be called with gobreaker's
// lock held.
func (b *Breaker) deliver() {
	if b.onStateChange == nil {
		return
	}
	b.mu.Lock()
	if b.delivering || b.next == len(b.queue) {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	finished := false
	defer func() {
		if !finished { // onStateChange panicked; let a later call go on
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	for b.next < len(b.queue) {
		t := b.queue[b.next]
		b.next++
		b.mu.Unlock()
		b.onStateChange(t.from, t.to)
		b.mu.Lock()
	}
	b.queue = b.queue[:0]
	b.next = 0
	b.delivering = false
	finished = true
	b.mu.Unlock()
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateClosed:
		return Closed
	case gobreaker.StateHalfOpen:
		return HalfOpen
	default:
		return Open
	}
}

// openError is ErrOpen with the breaker's name in its message.
type openError struct{ msg string }

func (e *openError) Error() string { return e.msg }
func (e *openError) Unwrap() error { return ErrOpen }

// Answered marks err as an error reply from Redis, such as WRONGTYPE or a
// script error: Redis answered, so the connection is healthy and Do counts
// the call as a success. Do still returns the error, and errors.Is and
// errors.As see through the mark to err. The mark may be wrapped further.
// Answered(nil) is nil.
func Answered(err error) error {
	if err == nil {
		return nil
	}
	return &answeredError{err: err}
}

// answeredError is the mark Answered puts on an error.
type answeredError struct{ err error }

func (e *answeredError) Error() string { return e.err.Error() }
func (e *answeredError) Unwrap() error { return e.err }

func isAnswered(err error) bool {
	var a *answeredError
	return errors.As(err, &a)
}
