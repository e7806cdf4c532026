package global

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/internal/plural"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/redis/go-redis/v9"
)

// Settlement is one key's part of a settlement round: what to charge, what to
// give back and what to take, all in micro-tokens, applied in that order
// after the bucket has refilled.
type Settlement struct {
	// Key names the bucket, as for Allow.
	Key string
	// Limit is the bucket's limit, from Limit.Micro.
	Limit MicroLimit
	// Consumed is spent elsewhere and is charged; the charge never sinks
	// the bucket below -Debt, so an outage's debt is bounded.
	Consumed int64
	// Returned was granted before and not spent; the bucket never rises
	// above Limit.Burst.
	Returned int64
	// Want is what to take now: as much of it as is there.
	Want int64
	// MinGrant is the least worth taking: if less than MinGrant is there,
	// nothing is taken. MinGrant == Want makes the grant all or nothing.
	MinGrant int64
	// Quantum makes the grant a whole number of Quantum micro-tokens (what
	// is left stays in Redis), so that a caller whose costs are whole tokens
	// never holds a fraction it cannot spend. 0 means 1 (no rounding).
	Quantum int64
	// Debt is the most the bucket may owe once Consumed is charged, in
	// micro-tokens: a charge never sinks it below -Debt, and a bucket in
	// deeper debt already (charged under a larger Debt) stays where it is
	// and refills. 0 means Limit.Burst; at most MaxDebt. Every settlement
	// of a key should carry the same Debt.
	Debt int64
	// Instance names the caller for de-duplication: 1 to MaxInstance bytes
	// of [0-9A-Za-z_.-]. It is used only with a Seq, and must be unique to
	// the process: one that restarts under an old name must not start its
	// Seq below what the old one sent (start from the wall clock in
	// microseconds, say), or its settlements read as duplicates.
	Instance string
	// Seq makes the settlement idempotent: sent again after its reply was
	// lost, it is not applied twice, and its Reply says Duplicate. 0 means
	// no de-duplication (every call is applied); otherwise Seq is in
	// [1, 2^53) and the caller keeps three rules. The Seqs of one Instance
	// only increase, one counter over all keys. A settlement sent again is
	// the same Settlement, every field alike. A key gets no settlement with
	// a higher Seq while one with a lower Seq is in doubt (sent, no reply):
	// that one is sent again first, since a lower Seq than the last applied
	// one reads as a duplicate. Redis forgets a key's Seqs when the key
	// expires (its bucket is full again) and prunes those more than 10
	// minutes old: a settlement sent again later than that may be applied
	// twice, which gives Returned back twice. So one with Returned above 0
	// is sent again for a few minutes at most, and then replaced by a new
	// one (a new Seq) that charges its Consumed and gives nothing back.
	Seq int64
	// Since marks Consumed as the late charge of admissions made while this
	// caller could not reach Redis: the Redis time its outage began (the
	// zero Time: none). It needs a Seq.
	Since time.Time
	// Claim is what of Consumed, at most, is not charged if the bucket lost
	// that much refill at its burst while nobody wrote it through the
	// outage (and other charges of the outage did not claim it first), in
	// micro-tokens: the refill the caller's own share of the bucket kept
	// while it was spent below its burst, which a bucket that saw the
	// admissions in time would have kept too. A bucket written during the
	// outage (a partial one: others reached it) credits nothing. 0 unless
	// Since is set; at most Consumed.
	Claim int64
}

// MaxInstance is the longest Settlement.Instance, in bytes.
const MaxInstance = 64

// MaxDebt is the largest Settlement.Debt, in micro-tokens: 2^50, about
// 1.1e9 tokens.
const MaxDebt = 1 << 50

// Reply is the outcome of one Settlement.
type Reply struct {
	// Granted is the micro-tokens taken: 0, or between MinGrant and Want,
	// a multiple of Quantum.
	Granted int64
	// Tokens is the micro-tokens left in the bucket after the settlement.
	// It is negative while the bucket is in debt, and never below
	// -MaxDebt.
	Tokens int64
	// Forgiven is the micro-tokens of Consumed that were not charged: the
	// bucket was at -Debt, or below, already (see Settlement.Debt). What
	// was forgiven is what the fleet may admit beyond B + R*T over a window
	// that spans the consumption (docs/accuracy.md, "Outages and the
	// debt").
	Forgiven int64
	// Credited is the micro-tokens of Consumed that were not charged out of
	// the outage's pool (see Settlement.Claim): the refill the bucket lost
	// while nobody wrote it, which the claim took back. The bucket took
	// Consumed less Credited less Forgiven.
	Credited int64
	// Now is the Redis time of the settlement.
	Now time.Time
	// Reset reports that Redis held something unreadable under the key
	// (another type, such as a string SET over the bucket, or garbled
	// fields) and that the script replaced it with a full bucket before
	// the settlement: the bucket's past was lost, as after a FLUSHALL.
	Reset bool
	// Duplicate reports that the settlement had been applied already, by
	// an earlier call with the same Instance and Seq whose reply was lost,
	// and that this one changed nothing: Granted is what that call granted
	// (0 if a settlement of the key with a higher Seq was applied since),
	// and Tokens is the bucket now. It is never true with Reset, nor for a
	// Settlement without a Seq.
	Duplicate bool
	// Superseded reports a Duplicate whose Seq is below the last one Redis
	// applied for the key and Instance: a later settlement went first, and
	// this one may never have been applied (its Consumed not charged). A
	// caller that cannot tell should charge that consumption again.
	Superseded bool
	// Err is this key's error alone: an invalid Settlement (not sent), a
	// Redis error for this key (such as a script error), a reply wrapping
	// ErrReply, or the round trip failing. If Err is not nil the other
	// fields are zero and the bucket may or may not have changed.
	Err error
}

// Settle applies batch to the buckets in Redis in one pipelined round trip
// and stores the outcome of batch[i] in replies[i], which must be at least
// as long. On a single Redis (standalone or Sentinel) each script call
// carries up to 100 keys, which costs Redis about half as much a key as a
// call a key; on a Cluster each carries one (go-redis splits the pipeline
// per node).
//
// Each Settlement is validated first; an invalid one gets its own Reply.Err
// wrapping ErrInvalidLimit, ErrInvalidCost or ErrInvalidKey and is not sent.
// The others are sent with EVALSHA; those that Redis answers with NOSCRIPT
// (after a restart, a failover or SCRIPT FLUSH) are sent again in a second
// pipeline with EVAL.
//
// A Settlement with a Seq is idempotent: when its reply is lost (a timeout,
// a connection killed after Redis ran it), the caller sends it again as it
// was, and Redis applies it only if it had not yet: see Settlement.Seq.
//
// A key's own failure goes into its Reply.Err and does not affect the
// others. Settle returns an error only when commands did not get a reply
// from Redis (the connection failed, ctx ended); the Reply.Err of each such
// key is set too. On a Cluster one node failing leaves the replies from the
// other nodes valid.
func (l *Limiter) Settle(ctx context.Context, batch []Settlement, replies []Reply) error {
	if len(replies) < len(batch) {
		return fmt.Errorf("global: settle: %d replies for %d settlements", len(replies), len(batch))
	}
	// The valid settlements, in calls: on one Redis, up to maxCallKeys
	// keys a call (a multi-key call costs Redis about half as much a key);
	// on a Cluster, whose keys each have a slot of their own, one a call.
	per := maxCallKeys
	if l.Spread() {
		per = 1
	}
	calls := make([]call, 0, (len(batch)+per-1)/per)
	for i := range batch {
		s := &batch[i]
		replies[i] = Reply{}
		if err := s.check(); err != nil {
			replies[i].Err = fmt.Errorf("global: settle %q: %w", s.Key, err)
			continue
		}
		if n := len(calls); n == 0 || len(calls[n-1].idx) == per {
			// Sized for the keys left, so that appending does not grow it.
			calls = append(calls, call{idx: make([]int, 0, min(per, len(batch)-i))})
		}
		c := &calls[len(calls)-1]
		c.idx = append(c.idx, i)
	}
	if len(calls) == 0 {
		return nil
	}
	for i := range calls {
		// The command whole, made here once: EVALSHA, the script's hash,
		// the keys and their arguments (a call of one key takes the 8, 10
		// or 12 of Settlement.appendArgs, one of many 10 each, or 12 each
		// if one of its keys has a Since).
		c := &calls[i]
		c.args = getArgs(3 + 13*len(c.idx))
		c.args = append(c.args, "evalsha", l.script.Hash(), len(c.idx))
		for _, j := range c.idx {
			c.args = append(c.args, l.Key(batch[j].Key))
		}
		if len(c.idx) == 1 {
			c.args = batch[c.idx[0]].appendArgs(c.args)
			continue
		}
		stride := 10
		for _, j := range c.idx {
			if !batch[j].Since.IsZero() {
				stride = 12
			}
		}
		var bx boxes
		for _, j := range c.idx {
			c.args = batch[j].appendBoxed(c.args, stride, &bx)
		}
	}
	l.send(ctx, calls, func(c *call) bool { return true })
	// Calls that found the script gone (a restart, a failover, SCRIPT
	// FLUSH) go again with the source.
	l.send(ctx, calls, func(c *call) bool { return isNoScript(c.cmd.Err()) })

	var failed error // the first error that is not a reply from Redis
	nfailed := 0
	for i := range calls {
		c := &calls[i]
		a, err := c.cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
			err = fmt.Errorf("%w: got nil, want %d integers", ErrReply, replyLen*len(c.idx))
		case err == nil:
			if len(a) != replyLen*len(c.idx) {
				err = fmt.Errorf("%w: got %d integers, want %d", ErrReply, len(a), replyLen*len(c.idx))
			}
		case !isReply(err):
			if failed == nil {
				failed = err
			}
			nfailed += len(c.idx)
		}
		for k, j := range c.idx {
			s := &batch[j]
			err := err
			if err == nil {
				replies[j], err = parseInts((*[replyLen]int64)(a[replyLen*k:]), s.Limit.Burst, s.Want, s.Consumed, s.Seq > 0)
			}
			if err != nil {
				replies[j] = Reply{Err: fmt.Errorf("global: settle %q: %w", s.Key, err)}
			}
		}
	}
	for i := range calls {
		putArgs(calls[i].args)
	}
	if failed != nil {
		return fmt.Errorf("global: settle: %d of %s got no reply: %w", nfailed, plural.Count(len(batch), "key"), failed)
	}
	return nil
}

// argsPool holds the argument slices of Settle's calls, empty, each as a
// *[]any: a long tail sends a call or more a decision, and its arguments
// were a fifth of what a cold decision allocated.
var argsPool sync.Pool

// getArgs returns an empty argument slice of capacity n at least (64 at
// least when it makes one, so that a pooled slice serves most calls).
func getArgs(n int) []any {
	if p, ok := argsPool.Get().(*[]any); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]any, 0, max(n, 64))
}

// putArgs gives a back to argsPool once its command is done with (go-redis
// keeps no command after the pipeline's Exec returns), cleared so that it
// holds no key.
func putArgs(a []any) {
	if cap(a) == 0 || cap(a) > 3+13*maxCallKeys {
		return
	}
	clear(a[:cap(a)])
	a = a[:0]
	argsPool.Put(&a)
}

// maxCallKeys is the most keys one script call carries: about half a
// millisecond of Redis's time, during which it serves nobody else.
const maxCallKeys = 100

// call is one script call of Settle: the settlements batch[idx], their keys
// and arguments, and the command that carries them.
type call struct {
	idx  []int
	args []any // the command: "evalsha", the hash, the keys' count, the keys, their arguments
	cmd  *redis.IntSliceCmd
}

// send sends the calls for which pick is true, with EVALSHA the first time
// and EVAL after (a call that has a command already), in one pipeline.
func (l *Limiter) send(ctx context.Context, calls []call, pick func(*call) bool) {
	var pipe redis.Pipeliner
	var cmds []*redis.IntSliceCmd
	for i := range calls {
		c := &calls[i]
		if !pick(c) {
			continue
		}
		if pipe == nil {
			pipe = l.rdb.Pipeline()
		}
		args := c.args
		if c.cmd != nil { // EVAL with the source, the rest as it was
			args = slices.Clone(args)
			args[0], args[1] = "eval", lua.Settle
		}
		// As redis.Script's EvalSha and Eval make it, without copying the
		// arguments again. The reply is read as integers, not each boxed
		// in an interface: one that holds anything else fails the call
		// as a connection whose stream cannot be read would (go-redis
		// drops the connection), rather than as a reply (ErrReply).
		c.cmd = redis.NewIntSliceCmd(ctx, args...)
		c.cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, c.cmd) // queued; its outcome comes with Exec
		cmds = append(cmds, c.cmd)
	}
	if pipe == nil {
		return
	}
	// Exec's error is the first command's error; each is read by the caller.
	_, err := pipe.Exec(ctx)
	markNotSent(cmds, err)
}

// args returns the script's ARGV for s: 8 values, then Instance and Seq if
// s has a Seq, then its since and Claim if it has a Since.
func (s *Settlement) args() []any { return s.appendArgs(nil) }

// appendArgs appends args() to a.
func (s *Settlement) appendArgs(a []any) []any {
	switch {
	case !s.Since.IsZero():
		return s.appendArgsN(a, 12)
	case s.Seq > 0:
		return s.appendArgsN(a, 10)
	}
	return s.appendArgsN(a, 8)
}

// appendArgsN appends the script's first n arguments for s (8, 10 or 12)
// to a, as a call of many keys takes them (10 or 12 each): without a Seq,
// an empty instance and seq 0; without a Since, since 0 and claim 0.
func (s *Settlement) appendArgsN(a []any, n int) []any { return s.appendBoxed(a, n, nil) }

// appendBoxed is appendArgsN with the integers boxed through bx (nil: each
// on its own).
func (s *Settlement) appendBoxed(a []any, n int, bx *boxes) []any {
	a = append(a, bx.box(s.Limit.Rate), bx.box(s.Limit.Burst), bx.box(s.Consumed), bx.box(s.Returned),
		bx.box(s.Want), bx.box(s.MinGrant), bx.box(max(s.Quantum, 1)), bx.box(s.debt()))
	if n >= 10 {
		if s.Seq > 0 {
			a = append(a, bx.instance(s.Instance), s.Seq)
		} else {
			a = append(a, "", 0)
		}
	}
	if n == 12 {
		if s.Since.IsZero() {
			a = append(a, 0, 0)
		} else {
			a = append(a, s.Since.UnixMicro(), s.Claim)
		}
	}
	return a
}

// boxes holds the interface values of the integers a call's arguments
// repeat, so that each is boxed once a call rather than once a key: the
// keys of a batch mostly share their limit (rate, burst and debt) and
// their want, and an int64 of 256 or more in an interface is an
// allocation (these were three of a cold decision's twenty).
type boxes struct {
	v    [4]int64
	a    [4]any
	n    int // values held
	next int // the slot the next new value takes once all are held
	id   any // the last instance boxed, or nil
}

// instance returns id in an interface, the one boxed before if it was the
// last: the settlements of a round all carry their instance's.
func (bx *boxes) instance(id string) any {
	if bx == nil {
		return id
	}
	if last, ok := bx.id.(string); ok && last == id {
		return bx.id
	}
	bx.id = id
	return bx.id
}

// box returns v in an interface, the one boxed before if bx holds v. A nil
// bx boxes each value on its own.
func (bx *boxes) box(v int64) any {
	if bx == nil || v >= 0 && v < 256 { // small values box without allocating
		return v
	}
	for i := range bx.n {
		if bx.v[i] == v {
			return bx.a[i]
		}
	}
	var a any = v
	i := bx.n
	if i == len(bx.v) {
		i, bx.next = bx.next, (bx.next+1)%len(bx.v)
	} else {
		bx.n++
	}
	bx.v[i], bx.a[i] = v, a
	return a
}

// debt returns s.Debt, or the burst for 0.
func (s *Settlement) debt() int64 {
	if s.Debt == 0 {
		return s.Limit.Burst
	}
	return s.Debt
}

// check validates s as the script requires, with the bounds of package limit.
func (s *Settlement) check() error {
	if err := limit.CheckKey(s.Key); err != nil {
		return err
	}
	m := s.Limit
	if m.Rate < 1 || m.Rate > limit.MaxRate*limit.Micro {
		return fmt.Errorf("%w: rate %d micro-tokens/s is outside [1, %d]", ErrInvalidLimit, m.Rate, int64(limit.MaxRate*limit.Micro))
	}
	if m.Burst < limit.Micro || m.Burst > limit.MaxBurst*limit.Micro {
		return fmt.Errorf("%w: burst %d micro-tokens is outside [%d, %d]", ErrInvalidLimit, m.Burst, limit.Micro, int64(limit.MaxBurst*limit.Micro))
	}
	for _, a := range [...]struct {
		name string
		v    int64
	}{{"consumed", s.Consumed}, {"returned", s.Returned}, {"want", s.Want}, {"min grant", s.MinGrant}} {
		if a.v < 0 || a.v > maxAmount {
			return fmt.Errorf("%w: %s %d micro-tokens is outside [0, 2^53)", ErrInvalidCost, a.name, a.v)
		}
	}
	if s.MinGrant > s.Want || s.MinGrant > m.Burst {
		// Such a grant can never be made.
		return fmt.Errorf("%w: min grant %d micro-tokens is above want %d or burst %d", ErrInvalidCost, s.MinGrant, s.Want, m.Burst)
	}
	if s.Quantum < 0 || s.Quantum > m.Burst {
		return fmt.Errorf("%w: quantum %d micro-tokens is outside [0, burst %d]", ErrInvalidCost, s.Quantum, m.Burst)
	}
	if s.Quantum > 1 && s.MinGrant > s.Want-s.Want%s.Quantum {
		// The grant is at most Want rounded down to a quantum.
		return fmt.Errorf("%w: min grant %d micro-tokens is above want %d rounded down to quantum %d", ErrInvalidCost, s.MinGrant, s.Want, s.Quantum)
	}
	if s.Debt < 0 || s.Debt > MaxDebt {
		return fmt.Errorf("%w: debt %d micro-tokens is outside [0, 2^50]", ErrInvalidCost, s.Debt)
	}
	if s.Seq < 0 || s.Seq > maxAmount {
		return fmt.Errorf("%w: seq %d is outside [0, 2^53)", ErrInvalidKey, s.Seq)
	}
	if s.Seq > 0 && !validInstance(s.Instance) {
		return fmt.Errorf("%w: instance %.80q is not 1 to %d bytes of [0-9A-Za-z_.-]", ErrInvalidKey, s.Instance, MaxInstance)
	}
	if !s.Since.IsZero() && (s.Seq == 0 || s.Since.UnixMicro() < 1 || s.Since.UnixMicro() > maxAmount) {
		return fmt.Errorf("%w: since %v needs a seq, and a time after 1970 in microseconds below 2^53", ErrInvalidKey, s.Since)
	}
	if s.Claim < 0 || s.Claim > s.Consumed || s.Claim > 0 && s.Since.IsZero() {
		return fmt.Errorf("%w: claim %d micro-tokens is outside [0, consumed %d], or has no since", ErrInvalidCost, s.Claim, s.Consumed)
	}
	return nil
}

// validInstance reports whether id is a valid Settlement.Instance.
func validInstance(id string) bool {
	if len(id) < 1 || len(id) > MaxInstance {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// errNotSent marks a command that was never sent, so got no reply.
var errNotSent = errors.New("not sent")

// markNotSent gives the commands of a pipeline whose Exec failed with
// execErr, and that hold neither a value nor an error, an error wrapping
// errNotSent. go-redis leaves the commands so when the connection could not
// be set up because Redis answered with an error (a wrong password, too
// many clients): its reply must not read as the commands' own.
func markNotSent(cmds []*redis.IntSliceCmd, execErr error) {
	if execErr == nil {
		return
	}
	for _, cmd := range cmds {
		if cmd != nil && cmd.Err() == nil && cmd.Val() == nil {
			cmd.SetErr(fmt.Errorf("%w: %v", errNotSent, execErr))
		}
	}
}

// isNoScript reports whether err means the script is not cached in Redis.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// IsRefusal reports whether err is Redis refusing the caller rather than the
// command: an error reply NOAUTH (no credentials; or, for a long command
// from a client that has not authenticated, "ERR Protocol error:
// unauthenticated ..."), WRONGPASS (wrong ones) or NOPERM (an ACL that
// denies the command or the key). Redis answers, but it
// will answer every call the same way until its configuration or the
// client's changes; a circuit breaker should count it as a failure, not as
// an answer.
func IsRefusal(err error) bool {
	if err == nil {
		return false // and no allocation for errors.As's target: most replies
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range [...]string{"NOAUTH", "WRONGPASS", "NOPERM", "ERR Protocol error: unauthenticated"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// isReply reports whether err is an error reply from Redis, as opposed to
// no reply at all.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
