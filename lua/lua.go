// Package lua holds the Lua scripts that change the token buckets in Redis,
// embedded in the binary. The scripts document their KEYS, ARGV and reply in a
// header comment; package global runs them.
package lua

import _ "embed"

// Settle is the source of settle.lua: one step of the authoritative token
// bucket kept in KEYS[1]. With ARGV rate, burst, consumed, returned, want and
// min_grant (integers, micro-tokens and micro-tokens per second) it refills
// the bucket from Redis TIME, takes back returned, charges consumed, grants
// up to want (or nothing if less than min_grant is there), writes the bucket
// with a TTL and replies {granted, tokens, now_us}.
//
//go:embed settle.lua
var Settle string
