package global

import (
	"context"
	"fmt"
	"time"
)

// witnessKeep is how long Redis keeps a beat of Witness at least, as
// heartbeat.lua keeps an instance's last beat: 10 ttls, at least this.
const witnessKeep = 10 * time.Minute

// WitnessKey returns the Redis key of the beat of instance id that Witness
// keeps beside the bucket of key: the prefix, ":w{", key, "}:" and id. It
// is never a bucket's key (those have "{" right after the prefix's ":"). On
// a Redis Cluster it is in the slot of the bucket of key, unless key starts
// with '}': that bucket's hash tag is empty, so Redis hashes its whole key,
// and the witness lands in another slot.
func (l *Limiter) WitnessKey(key, id string) string {
	return l.prefix[:len(l.prefix)-1] + "w{" + key + "}:" + id
}

// Witness records a beat of instance id on the Redis node that holds the
// bucket of key, at that node's time, and returns that time and the beat
// before it that the node held (zero if none: a first beat, a silence of
// more than 10 minutes and 10 ttls, or a node that lost it). An instance
// whose last beat there was later than that talks to a node that lost its
// writes since: a replica that lagged promoted in its place, a restart from
// an older snapshot. On a single Redis the heartbeat tells as much
// (HeartbeatWas); on a Redis Cluster, a beat for a key of each master tells
// which master lost its writes. The beat is kept for 10 ttls, at least 10
// minutes.
//
// Errors are those of Heartbeat.
func (l *Limiter) Witness(ctx context.Context, key, id string, ttl time.Duration) (now, was time.Time, err error) {
	ms, err := checkBeat(id, ttl)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("global: witness %q: %w", id, err)
	}
	keep := max(10*ms, witnessKeep.Milliseconds())
	now, was, err = l.runWitness(ctx, key, id, min(keep, MaxTTL.Milliseconds()))
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("global: witness %q: %w", id, err)
	}
	return now, was, nil
}

// Unwitness deletes the beat of instance id that Witness keeps beside the
// bucket of key: call it when the instance shuts down, as Leave. Its errors
// are those of Witness.
func (l *Limiter) Unwitness(ctx context.Context, key, id string) error {
	if _, err := checkBeat(id, time.Second); err != nil {
		return fmt.Errorf("global: unwitness %q: %w", id, err)
	}
	if _, _, err := l.runWitness(ctx, key, id, 0); err != nil {
		return fmt.Errorf("global: unwitness %q: %w", id, err)
	}
	return nil
}

// runWitness runs the witness script once with keep_ms keep.
func (l *Limiter) runWitness(ctx context.Context, key, id string, keep int64) (now, was time.Time, err error) {
	x, err := l.runInts(ctx, l.witness, []string{l.WitnessKey(key, id)}, 2, keep)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	return beatTimes(x[0], x[1])
}
