// Package lua holds the Lua scripts that change the token buckets and the
// fleet set in Redis, embedded in the binary. The scripts document their
// KEYS, ARGV and reply in a header comment; package global runs them.
package lua

import (
	_ "embed"
	"strings"
)

// Settle is the source of settle.lua: one step of the authoritative token
// bucket kept in KEYS[1]. With ARGV rate, burst, consumed, returned, want,
// min_grant, quantum and debt (integers, micro-tokens and micro-tokens per
// second) it refills the bucket from Redis TIME, takes back returned,
// charges consumed (never below -debt), grants up to want in whole quanta
// (or nothing if that is less than min_grant), writes the bucket with a TTL
// and replies {granted, tokens, now_us, reset, dup, forgiven, credited}. A key it
// cannot read (another type, or garbled fields) is replaced by a full
// bucket, with reset 1. With two more ARGV, instance and seq, a call is
// applied once: sent again, it changes nothing and replies dup 1 with what
// it granted the first time. Two more again, since and claim, mark the
// late charge of an outage's admissions: up to claim of it is not charged,
// out of the refill the bucket lost at its burst while nobody wrote it,
// and the reply's credited says how much was not. One call may carry up
// to 1000 keys, with 10 or 12 ARGV each (instance "" and seq 0 for none),
// and replies 7 integers for each.
//
//go:embed settle.lua
var Settle string

// Heartbeat is the source of heartbeat.lua: one beat of an instance in the
// fleet kept in KEYS[1], a sorted set of instance ids scored by the Redis
// time of their last beat in milliseconds. With ARGV id, ttl_ms and leave it
// sets id's score to Redis TIME (or removes id when leave is 1), drops every
// member not heard from within ttl_ms, renews the set's TTL to 2*ttl_ms (at
// least 1 s) and replies {live, now_ms}: the members left and the Redis time.
//
//go:embed heartbeat.lua
var Heartbeat string

// Witness is the source of witness.lua: an instance's last beat on one Redis
// node, kept in KEYS[1] beside a bucket of that node. With ARGV keep_ms it
// replies {now_ms, was_ms}: Redis TIME and the beat it held before (0 if
// none), and sets the beat to now for keep_ms (deletes it for keep_ms 0).
// On a Redis Cluster each
// master keeps one for each instance, so that an instance sees which node
// lost its writes.
//
//go:embed witness.lua
var Witness string

// Peek is the source of peek.lua, with bucket.lua in its place: what the
// bucket kept in KEYS[1] holds now, read without writing anything. With ARGV
// rate and burst (micro-tokens per second and micro-tokens) it replies
// {tokens, now_us}: the bucket refilled to Redis TIME as Settle would refill
// it, a missing or unreadable key read as a full bucket.
var Peek = withBucket(peekSource)

// Ahead is the source of ahead.lua, with bucket.lua in its place: cost
// micro-tokens taken from the bucket kept in KEYS[1] ahead of time, into
// debt, all or nothing. With ARGV rate, burst, cost and debt it refills the
// bucket from Redis TIME as Settle does, takes cost if the bucket then owes
// no more than debt, writes it with Settle's TTL (nothing if it took
// nothing) and replies {granted, tokens, now_us}: the taker's tokens are due
// once the bucket is back at 0.
var Ahead = withBucket(aheadSource)

// Reset is the source of reset.lua: the bucket kept in KEYS[1] full again,
// whatever it held, and marked. With ARGV grace_ms and keep_ms it replaces
// the key with a full bucket and a mark that Settle reads: for grace_ms its
// charges take from the bucket down to 0 at most, never into debt, and until
// keep_ms so do the charges of an outage that began before the reset. It
// replies {now_us}.
//
//go:embed reset.lua
var Reset string

var (
	//go:embed peek.lua
	peekSource string
	//go:embed ahead.lua
	aheadSource string
	//go:embed bucket.lua
	bucketSource string
)

// bucketMark is the line of peek.lua and ahead.lua that bucket.lua replaces.
const bucketMark = "--[[bucket.lua]]\n"

// withBucket returns src with bucket.lua in the place of its mark.
func withBucket(src string) string {
	if strings.Count(src, bucketMark) != 1 {
		panic("lua: a script without its one " + strings.TrimSpace(bucketMark) + " line")
	}
	return strings.Replace(src, bucketMark, bucketSource, 1)
}
