package global_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/redis/go-redis/v9"
)

// TestWitness: a beat on the node of a key returns the one before it, kept
// beside the key's bucket (in its slot on a Cluster), apart from every
// bucket; a node that lost it reads as none.
func TestWitness(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		l := newLimiter(t, b)
		wk := l.WitnessKey("user:1", "a")
		if wk == l.Key("user:1") || wk == l.FleetKey()+":a" {
			t.Fatalf("WitnessKey = %q, a bucket's or the fleet's key", wk)
		}
		if c, ok := b.rdb.(*redis.ClusterClient); ok {
			w, err := c.ClusterKeySlot(ctx, wk).Result()
			k, err2 := c.ClusterKeySlot(ctx, l.Key("user:1")).Result()
			if err != nil || err2 != nil || w != k {
				t.Fatalf("slots: witness %d, %v; bucket %d, %v", w, err, k, err2)
			}
		}
		now1, was1, err := l.Witness(ctx, "user:1", "a", time.Second)
		if err != nil || now1.IsZero() || !was1.IsZero() {
			t.Fatalf("first Witness = %v, %v, %v; want now, zero, nil", now1, was1, err)
		}
		if b.m != nil {
			b.m.SetTime(now1.Add(10 * time.Millisecond))
		}
		now2, was2, err := l.Witness(ctx, "user:1", "a", time.Second)
		if err != nil || !was2.Equal(now1) || now2.Before(now1) {
			t.Fatalf("second Witness = %v, %v, %v; want >= %v, %v, nil", now2, was2, err, now1, now1)
		}
		if ttl := b.ttl(ctx, t, wk); ttl < 9*time.Minute || ttl > 10*time.Minute {
			t.Errorf("TTL %s = %v, want 10 minutes", wk, ttl)
		}
		if _, was, err := l.Witness(ctx, "user:1", "b", time.Second); err != nil || !was.IsZero() {
			t.Errorf("another instance's first Witness = %v, %v; want zero, nil", was, err)
		}
		if err := b.rdb.Del(ctx, wk).Err(); err != nil {
			t.Fatal(err)
		}
		if _, was, err := l.Witness(ctx, "user:1", "a", time.Second); err != nil || !was.IsZero() {
			t.Errorf("Witness after the beat was lost = %v, %v; want zero, nil", was, err)
		}
		if err := l.Unwitness(ctx, "user:1", "a"); err != nil {
			t.Fatal(err)
		}
		if n, err := b.rdb.Exists(ctx, wk).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s after Unwitness = %d, %v; want 0", wk, n, err)
		}
		if _, _, err := l.Witness(ctx, "user:1", "", time.Second); !errors.Is(err, global.ErrInvalidKey) {
			t.Errorf("Witness with no id: %v, want ErrInvalidKey", err)
		}
	})
}
