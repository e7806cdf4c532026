package rls

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// The bucket key of a descriptor names the domain, the unit of its limit
// and the request's entries, keys and values as sent:
//
//	h:another|key2=123|key3=abc
//
// The first byte is the unit (unitByte), then ':', the domain, and for
// each entry '|', its key, '=' and its value. An entry matched by a
// wildcard with share_threshold has '~' and the pattern instead of '=' and
// the value ("files~files/*"), so that every value the pattern matches
// shares one bucket, as in the original. A '\', '|', '=' or '~' inside the
// domain, a key or a value is escaped with a '\', so the encoding is
// injective: two requests share a bucket only if they have the same
// domain, unit and entries. The original's cache key is the same in
// substance (a prefix, the domain, each key and value or shared pattern,
// and the start of the unit's window), without the escapes.
//
// A key longer than maxPlainKey bytes is hashed: '#', the first 16 bytes
// of the SHA-256 of the whole key in hex, ':' and the key's first
// hashedPrefix bytes, for a reader of Redis. A plain key starts with a
// unit's letter, never '#', so a hashed key cannot meet a plain one; two
// hashed keys meet only if their 128-bit hashes do, which takes about
// 2^64 tries even for someone choosing the values (SHA-256 resists
// collisions; a non-cryptographic hash would let a client aim at another
// client's bucket).
const (
	// maxPlainKey is the longest key used as it is. The Limiter accepts
	// keys of up to 1024 bytes; a shorter bound keeps Redis's keys and the
	// memory of the in-process store small.
	maxPlainKey = 256
	// hashedPrefix is how much of a long key a hashed one shows.
	hashedPrefix = 64
)

// unitByte is the first byte of the keys of a limit in unit u. The
// original keys its counters by the unit's window, so limits of one
// descriptor in two units (a configured one and an override) never share
// a counter; the byte does the same here.
func unitByte(u config.Unit) byte {
	const letters = "?smhdMyw" // by config.Unit: unknown, second, ..., year, week
	if u >= 0 && int(u) < len(letters) {
		return letters[u]
	}
	return '?'
}

// appendKey appends the bucket key of a descriptor to dst: the domain, the
// unit of its limit, and its entries, where shared, when not empty, holds
// for each entry the pattern that replaces its value ("" for an entry that
// shares nothing; config.Match.SharedPatterns). It returns the extended
// buffer. A key longer than maxPlainKey is hashed (see above).
func appendKey(dst []byte, domain string, u config.Unit, entries []config.Entry, shared []string) []byte {
	start := len(dst)
	dst = append(dst, unitByte(u), ':')
	dst = appendEscaped(dst, domain)
	for i, e := range entries {
		dst = append(dst, '|')
		dst = appendEscaped(dst, e.Key)
		if i < len(shared) && shared[i] != "" {
			dst = append(dst, '~')
			dst = appendEscaped(dst, shared[i])
			continue
		}
		dst = append(dst, '=')
		dst = appendEscaped(dst, e.Value)
	}
	if len(dst)-start <= maxPlainKey {
		return dst
	}
	sum := sha256.Sum256(dst[start:])
	var head [1 + 2*16 + 1 + hashedPrefix]byte
	head[0] = '#'
	hex.Encode(head[1:33], sum[:16])
	head[33] = ':'
	copy(head[34:], dst[start:start+hashedPrefix])
	return append(dst[:start], head[:]...)
}

// appendEscaped appends s to dst with a '\' before each '\', '|', '=' and
// '~'.
func appendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '|', '=', '~':
			dst = append(dst, '\\', c)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
