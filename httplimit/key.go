package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
)

// KeyFunc returns the key a request is limited by: the name of its bucket.
// It returns an error wrapping ErrNoKey when the request carries nothing to
// key it by (no API key, no user); FirstKey then tries the next KeyFunc,
// and the middleware answers 400. Other errors are answered 500.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey reports a request that carries nothing a KeyFunc can key it by.
var ErrNoKey = errors.New("httplimit: no rate-limit key in the request")

// ByHeader returns a KeyFunc that keys a request by the first value of the
// header name (an API key, a tenant): the key is the header's name in
// lower case, a colon and the value, such as "x-api-key:abc". A request
// without the header, or with an empty value, has no key (ErrNoKey).
func ByHeader(name string) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	prefix := strings.ToLower(canon) + ":"
	return func(r *http.Request) (string, error) {
		vs := r.Header[canon]
		if len(vs) == 0 || vs[0] == "" {
			return "", ErrNoKey
		}
		return prefix + vs[0], nil
	}
}

// ByUser returns a KeyFunc that keys a request by the authenticated user
// that user finds in its context (put there by the authentication
// middleware that runs before this one): the key is "user:" and the user's
// ID. A request for which user reports no user, or an empty ID, has no key
// (ErrNoKey).
func ByUser(user func(ctx context.Context) (id string, ok bool)) KeyFunc {
	return func(r *http.Request) (string, error) {
		id, ok := user(r.Context())
		if !ok || id == "" {
			return "", ErrNoKey
		}
		return "user:" + id, nil
	}
}

// FirstKey returns a KeyFunc that tries each of keys in turn and returns the
// first key found: the first result whose error is not ErrNoKey. For
// example, FirstKey(ByUser(f), ByHeader("X-API-Key"), ClientIP{}.Key) keys
// a signed-in user by user, else a client by its API key, else by its
// address. It has no key only if none has.
func FirstKey(keys ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		for _, k := range keys {
			key, err := k(r)
			if err == nil && key != "" {
				return key, nil
			}
			if err != nil && !errors.Is(err, ErrNoKey) {
				return "", err
			}
		}
		return "", ErrNoKey
	}
}

// maxKey is the longest key the middleware passes to the Limiter as it is;
// longer keys are hashed (see BucketKey).
const maxKey = 256

// hashPrefix starts the keys that BucketKey hashes.
const hashPrefix = "sha256:"

// BucketKey returns the key the middleware asks the Limiter about for key,
// the key of a tier. A key of at most 256 bytes is itself, unless it starts
// with "sha256:"; a longer one, or one that starts with "sha256:", is
// "sha256:" and the hex SHA-256 of the key (71 bytes). A long key is so
// still limited, under a key of bounded size (the Limiter refuses keys over
// 1024 bytes), and it cannot share a bucket with a short key: a short key
// that looks like a hashed one is hashed as well, and two hashed keys are
// the same only if the keys are. The empty key is ErrNoKey.
//
// It is exported so that other integrations key their buckets as the
// middleware does: package grpclimit passes its keys through it.
func BucketKey(key string) (string, error) {
	if key == "" {
		return "", ErrNoKey
	}
	if len(key) <= maxKey && !strings.HasPrefix(key, hashPrefix) {
		return key, nil
	}
	sum := sha256.Sum256([]byte(key))
	var buf [len(hashPrefix) + 2*sha256.Size]byte
	copy(buf[:], hashPrefix)
	hex.Encode(buf[len(hashPrefix):], sum[:])
	return string(buf[:]), nil
}
