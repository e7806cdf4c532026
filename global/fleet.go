package global

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// Bounds of Heartbeat and Leave, as the script checks them too.
const (
	// MaxIDLen is the longest instance id, in bytes.
	MaxIDLen = 256
	// MaxTTL is the longest heartbeat TTL: 2^40 ms, about 35 years.
	MaxTTL = (1 << 40) * time.Millisecond
)

// ErrInvalidTTL means a heartbeat TTL below 1 ms or above MaxTTL. Like the
// other misuse errors it is reported before Redis is touched.
var ErrInvalidTTL = errors.New("invalid ttl")

// fleetSuffix follows the prefix in the key of the fleet set, resetsSuffix
// in the key of the fleet's resets (ResetsKey).
const (
	fleetSuffix  = ":fleet{fleet}"
	resetsSuffix = ":resets{fleet}"
)

// resetsKeep is how long the fleet is told of a reset: heartbeat.lua's
// RESETS_MS.
const resetsKeep = 10 * time.Minute

// maxLive bounds the live count of a reply: more instances than that is a
// garbled reply, not a fleet, and it fits an int everywhere.
const maxLive = math.MaxInt32

// FleetKey returns the Redis key of the fleet set that Heartbeat and Leave
// keep: the prefix and ":fleet{fleet}", "hybrid:fleet{fleet}" by default.
//
// It is never the key of a bucket, for this prefix or any other. A bucket key
// is prefix + ":{" + key + "}" with a prefix that has no braces, so its first
// '{' comes right after a ':'; in the fleet key the first '{' comes right
// after a 't'. Fleet keys of different prefixes differ too, since they end
// alike. The hash tag is "fleet", so on a Redis Cluster the set shares a slot
// with the bucket of the key "fleet" (and of keys that start with "fleet}"),
// never a key.
func (l *Limiter) FleetKey() string {
	return l.fleetKey
}

// Heartbeat records that the instance id is live, at the Redis time of the
// call, and returns how many instances of the fleet are live (this one
// included) and that time, to the millisecond.
//
// Every instance of a fleet (the Limiters sharing a prefix) beats under an id
// of its own, well within ttl (every ttl/3, say), and all with the same ttl.
// An instance is live while its last beat is less than ttl old in Redis time;
// each call drops those that are not, so an instance that crashed drops out
// of the count ttl after its last beat, without anyone saying so. Each call
// also sets the set to expire 2*ttl later (at least 1 s), so a fleet that
// stops beating leaves nothing behind.
//
// ttl is rounded up to whole milliseconds. If the script is not cached in
// Redis it is sent again. Errors wrap ErrInvalidKey for an empty id or one
// longer than MaxIDLen and ErrInvalidTTL for ttl below 1 ms or above MaxTTL
// (both checked before Redis is touched), or ErrReply for a reply that is
// not two integers in range; others come from Redis.
func (l *Limiter) Heartbeat(ctx context.Context, id string, ttl time.Duration) (live int, now time.Time, err error) {
	live, now, _, err = l.HeartbeatWas(ctx, id, ttl)
	return live, now, err
}

// HeartbeatWas is Heartbeat that also returns the time of id's beat before
// this one as Redis held it (zero if it held none: a first beat, a silence
// of more than 10 minutes and 10 ttls, or a Redis that lost it). Redis keeps
// it in a key of the instance's own beside the fleet set (FleetKey + ":" +
// id), which the fleet's reaping does not touch. An instance whose last beat
// was later than that talks to a Redis that lost its writes since then: a
// failover to a replica that lagged, a restart from an older snapshot.
func (l *Limiter) HeartbeatWas(ctx context.Context, id string, ttl time.Duration) (live int, now, was time.Time, err error) {
	live, now, was, _, err = l.HeartbeatReset(ctx, id, ttl)
	return live, now, was, err
}

// HeartbeatReset is HeartbeatWas that also returns the Redis time of the
// latest reset the fleet was told of within the last 10 minutes
// (AnnounceReset), the zero Time if none: an instance that has not seen it
// yet stops trusting its views of the buckets from before it.
func (l *Limiter) HeartbeatReset(ctx context.Context, id string, ttl time.Duration) (live int, now, was, reset time.Time, err error) {
	b, err := l.beat(ctx, id, ttl, false)
	if err != nil {
		return 0, time.Time{}, time.Time{}, time.Time{}, fmt.Errorf("global: heartbeat %q: %w", id, err)
	}
	return b.live, b.now, b.was, b.reset, nil
}

// ResetsKey returns the Redis key of the fleet's resets, a sorted set of
// the keys reset lately scored by the Redis time of their reset in
// milliseconds (AnnounceReset, HeartbeatReset): the prefix and
// ":resets{fleet}", in the fleet set's slot.
func (l *Limiter) ResetsKey() string { return l.resetsKey }

// AnnounceReset tells the fleet that key's bucket was reset at at (the time
// Reset returned): the heartbeats of the next 10 minutes return it
// (HeartbeatReset). Errors are Redis's.
func (l *Limiter) AnnounceReset(ctx context.Context, key string, at time.Time) error {
	pipe := l.rdb.Pipeline()
	pipe.ZAdd(ctx, l.resetsKey, redis.Z{Score: float64(at.UnixMilli()), Member: key})
	pipe.PExpire(ctx, l.resetsKey, resetsKeep)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("global: announce the reset of %q: %w", key, err)
	}
	return nil
}

// Leave removes the instance id from the fleet at once, so that the others
// count one less without waiting ttl, drops the instances not heard from
// within ttl, as Heartbeat does, and returns how many are left. Leaving
// twice, or without a beat, is not an error. Call it when an instance shuts
// down, with the ttl it beat with. Its errors are those of Heartbeat.
func (l *Limiter) Leave(ctx context.Context, id string, ttl time.Duration) (live int, err error) {
	b, err := l.beat(ctx, id, ttl, true)
	if err != nil {
		return 0, fmt.Errorf("global: leave %q: %w", id, err)
	}
	return b.live, nil
}

// beat runs the heartbeat script once.
func (l *Limiter) beat(ctx context.Context, id string, ttl time.Duration, leave bool) (beatReply, error) {
	ms, err := checkBeat(id, ttl)
	if err != nil {
		return beatReply{}, err
	}
	flag, minLive := 0, int64(1) // a beat counts itself
	if leave {
		flag, minLive = 1, 0
	}
	v, err := l.fleet.Run(ctx, l.rdb, []string{l.fleetKey, l.fleetKey + ":" + id, l.resetsKey}, id, ms, flag).Result()
	if errors.Is(err, redis.Nil) {
		err = fmt.Errorf("%w: got nil, want 4 integers", ErrReply)
	}
	if err != nil {
		return beatReply{}, err
	}
	return parseFleetReply(v, minLive)
}

// checkBeat validates the arguments of Heartbeat and Leave and returns ttl in
// milliseconds, rounded up.
func checkBeat(id string, ttl time.Duration) (int64, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: empty id", ErrInvalidKey)
	}
	if len(id) > MaxIDLen {
		return 0, fmt.Errorf("%w: id of %d bytes, more than %d", ErrInvalidKey, len(id), MaxIDLen)
	}
	if ttl < time.Millisecond || ttl > MaxTTL {
		return 0, fmt.Errorf("%w: %v is outside [1ms, 2^40 ms]", ErrInvalidTTL, ttl)
	}
	return int64((ttl + time.Millisecond - 1) / time.Millisecond), nil
}

// beatReply is a heartbeat's reply: the live count, the Redis time, this
// instance's beat before (zero if none) and the latest reset (zero if none).
type beatReply struct {
	live            int
	now, was, reset time.Time
}

// parseFleetReply reads the script's reply {live, now_ms, was_ms, reset_ms},
// in which live is at least minLive. It never panics: anything else is an
// error wrapping ErrReply.
func parseFleetReply(v any, minLive int64) (beatReply, error) {
	x, err := integers(v, 4)
	if err != nil {
		return beatReply{}, err
	}
	if live := x[0]; live < minLive || live > maxLive {
		return beatReply{}, fmt.Errorf("%w: live %d is outside [%d, %d]", ErrReply, live, minLive, maxLive)
	}
	now, was, err := beatTimes(x[1], x[2])
	if err != nil {
		return beatReply{}, err
	}
	if x[3] < 0 || x[3] > maxAmount {
		return beatReply{}, fmt.Errorf("%w: reset %d ms is outside [0, 2^53)", ErrReply, x[3])
	}
	b := beatReply{live: int(x[0]), now: now, was: was}
	if x[3] > 0 {
		b.reset = time.UnixMilli(x[3])
	}
	return b, nil
}

// runInts runs script on keys with args and reads its reply, which must be
// n integers: nil, or anything else, is an error wrapping ErrReply; other
// errors are Redis's.
func (l *Limiter) runInts(ctx context.Context, script *redis.Script, keys []string, n int, args ...any) ([]int64, error) {
	v, err := script.Run(ctx, l.rdb, keys, args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: got nil, want %d integers", ErrReply, n)
	}
	if err != nil {
		return nil, err
	}
	return integers(v, n)
}

// integers reads a reply of n integers. It never panics: anything else is
// an error wrapping ErrReply.
func integers(v any, n int) ([]int64, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: got %T, want %d integers", ErrReply, v, n)
	}
	if len(a) != n {
		return nil, fmt.Errorf("%w: got %d values, want %d integers", ErrReply, len(a), n)
	}
	x := make([]int64, n)
	for i, e := range a {
		if x[i], ok = e.(int64); !ok {
			return nil, fmt.Errorf("%w: value %d is %T, want an integer", ErrReply, i, e)
		}
	}
	return x, nil
}

// beatTimes reads the Redis time and an instance's last beat, in
// milliseconds, of a reply: a last beat of 0 is none (the zero Time).
func beatTimes(now, was int64) (time.Time, time.Time, error) {
	var zero time.Time
	switch {
	case now < 0 || now > maxAmount:
		return zero, zero, fmt.Errorf("%w: time %d ms is outside [0, 2^53)", ErrReply, now)
	case was < 0 || was > maxAmount:
		return zero, zero, fmt.Errorf("%w: last beat %d ms is outside [0, 2^53)", ErrReply, was)
	}
	var wasT time.Time
	if was > 0 {
		wasT = time.UnixMilli(was)
	}
	return time.UnixMilli(now), wasT, nil
}
