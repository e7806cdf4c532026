package windows

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// epoch is where a fake clock starts: a multiple of every window the tests
// use, so that fixed windows start at offset 0.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeRedis is a miniredis whose clock the test moves: SetTime for what
// TIME answers, FastForward for the TTLs, in step.
type fakeRedis struct {
	m   *miniredis.Miniredis
	rdb *redis.Client
	at  time.Duration // since epoch
}

// newFakeRedis starts a miniredis at epoch, stopped at cleanup, and a
// client of it.
func newFakeRedis(t *testing.T) *fakeRedis {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(epoch)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return &fakeRedis{m: m, rdb: rdb}
}

// set moves the clock to at since epoch; it never moves it back.
func (f *fakeRedis) set(at time.Duration) {
	if at <= f.at {
		return
	}
	f.m.FastForward(at - f.at)
	f.at = at
	f.m.SetTime(f.now())
}

// now returns the clock's time.
func (f *fakeRedis) now() time.Time { return epoch.Add(f.at) }
