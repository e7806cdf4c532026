package windows

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestUnscriptedSteps: the same fixed windows as the script's, by the
// caller's clock.
func TestUnscriptedSteps(t *testing.T) {
	f := newFakeRedis(t)
	u, err := NewUnscripted(f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	lim := Limit{3, time.Second}
	steps := []step{
		{0, 1, true, 1, 0},
		{100 * ms, 2, true, 3, 0},
		{999 * ms, 1, false, 3, ms},
		{1000 * ms, 3, true, 3, 0}, // the next window's key
		{1000 * ms, 1, false, 3, 1000 * ms},
	}
	for i, s := range steps {
		f.set(s.at)
		got, err := u.Allow(context.Background(), f.now(), "user42", lim, s.n)
		if err != nil {
			t.Fatalf("step %d: Allow(%v, %d): %v", i, s.at, s.n, err)
		}
		want := Result{Allowed: s.ok, Count: s.count, RetryAfter: s.retry, Now: f.now()}
		if got != want {
			t.Errorf("step %d: Allow(%v, %d) = %+v, want %+v", i, s.at, s.n, got, want)
		}
	}
}

// between is a Client that runs a function once, after the first GET has
// been answered and before its caller goes on: another client's request
// between this one's GET and INCRBY.
type between struct {
	Client
	fn func()
}

func (b *between) Get(ctx context.Context, key string) *redis.StringCmd {
	cmd := b.Client.Get(ctx, key)
	if fn := b.fn; fn != nil {
		b.fn = nil
		fn()
	}
	return cmd
}

// TestUnscriptedRace: two clients that read the window's count before
// either has added to it both admit. With two left of a limit of 3 and a
// request of 2 each, the window holds 5; the script, one atomic step, never
// lets a request in between.
func TestUnscriptedRace(t *testing.T) {
	f := newFakeRedis(t)
	ctx := context.Background()
	lim := Limit{3, time.Second}
	other, err := NewUnscripted(f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Allow(ctx, f.now(), "k", lim, 1); err != nil || !res.Allowed {
		t.Fatalf("first Allow = %+v, %v", res, err)
	}
	var (
		second    Result
		secondErr error
	)
	racy := &between{Client: f.rdb, fn: func() {
		second, secondErr = other.Allow(ctx, f.now(), "k", lim, 2)
	}}
	u, err := NewUnscripted(racy)
	if err != nil {
		t.Fatal(err)
	}
	first, err := u.Allow(ctx, f.now(), "k", lim, 2)
	if err != nil || secondErr != nil {
		t.Fatal(err, secondErr)
	}
	if !first.Allowed || !second.Allowed {
		t.Fatalf("Allow, and another client's between its GET and INCRBY = %+v, %+v; want both allowed", first, second)
	}
	if first.Count != 5 {
		t.Errorf("the window holds %d, want 5 (limit 3)", first.Count)
	}
}
