package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Bucket reads the token bucket that settle.lua keeps in key, in either of
// its forms: a string "<t> <ts>" (a bucket with no records) or a hash with
// fields t and ts (one with records). It returns the bucket's micro-tokens
// and its Redis time in microseconds; ok is false when key does not exist.
// A key of another type, or a bucket it cannot read, is an error.
func Bucket(ctx context.Context, rdb redis.Cmdable, key string) (t, ts int64, ok bool, err error) {
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		return 0, 0, false, err
	}
	switch typ {
	case "none":
		return 0, 0, false, nil
	case "string":
		s, err := rdb.Get(ctx, key).Result()
		if err != nil {
			return 0, 0, false, err
		}
		t, ts, err = parseBucket(s)
		return t, ts, err == nil, err
	case "hash":
		h, err := rdb.HMGet(ctx, key, "t", "ts").Result()
		if err != nil {
			return 0, 0, false, err
		}
		st, _ := h[0].(string)
		sts, _ := h[1].(string)
		t, ts, err = parseBucket(st + " " + sts)
		return t, ts, err == nil, err
	}
	return 0, 0, false, fmt.Errorf("redistest: bucket %q is a %s", key, typ)
}

// MiniBucket is Bucket for a key of a miniredis, read directly.
func MiniBucket(m *miniredis.Miniredis, key string) (t, ts int64, ok bool, err error) {
	switch typ := m.Type(key); typ {
	case "":
		return 0, 0, false, nil
	case "string":
		s, err := m.Get(key)
		if err != nil {
			return 0, 0, false, err
		}
		t, ts, err = parseBucket(s)
		return t, ts, err == nil, err
	case "hash":
		t, ts, err = parseBucket(m.HGet(key, "t") + " " + m.HGet(key, "ts"))
		return t, ts, err == nil, err
	default:
		return 0, 0, false, fmt.Errorf("redistest: bucket %q is a %s", key, typ)
	}
}

// parseBucket parses a bucket kept as a string, "<t> <ts>".
func parseBucket(s string) (t, ts int64, err error) {
	a, b, found := strings.Cut(s, " ")
	if !found {
		return 0, 0, fmt.Errorf("redistest: bucket %q is not \"<t> <ts>\"", s)
	}
	if t, err = strconv.ParseInt(a, 10, 64); err == nil {
		ts, err = strconv.ParseInt(b, 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("redistest: bucket %q: %w", s, err)
	}
	return t, ts, nil
}

// BucketTokens is Bucket's micro-tokens alone, 0 with an error for a key
// that holds no bucket.
func BucketTokens(ctx context.Context, rdb redis.Cmdable, key string) (int64, error) {
	t, _, ok, err := Bucket(ctx, rdb, key)
	if err == nil && !ok {
		err = fmt.Errorf("redistest: no bucket in %q: %w", key, redis.Nil)
	}
	return t, err
}
