package global_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// exampleRedis starts an embedded Redis with its clock at t and returns a
// client of it and a func that stops both.
func exampleRedis(t time.Time) (*miniredis.Miniredis, *redis.Client, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	m.SetTime(t)
	rdb := redis.NewClient(&redis.Options{
		Addr:                     m.Addr(),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	return m, rdb, func() { rdb.Close(); m.Close() }
}

// A burst of 10 and 5 tokens a second: 10 requests pass at once, the 11th
// waits 200 ms; a second later 5 more pass.
func ExampleLimiter_Allow() {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m, rdb, stop := exampleRedis(start)
	defer stop()
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	lim := global.Limit{Rate: 5, Burst: 10}

	show := func() {
		passed := 0
		for {
			r, err := l.Allow(ctx, "user42", lim, 1)
			if err != nil {
				panic(err)
			}
			if !r.Allowed {
				fmt.Printf("%v: %d passed, then denied: retry after %v, full after %v\n",
					r.Now.Sub(start), passed, r.RetryAfter, r.ResetAfter)
				return
			}
			passed++
		}
	}
	show()
	m.SetTime(start.Add(time.Second))
	show()
	m.SetTime(start.Add(time.Hour))
	show()
	// Output:
	// 0s: 10 passed, then denied: retry after 200ms, full after 2s
	// 1s: 5 passed, then denied: retry after 200ms, full after 2s
	// 1h0m0s: 10 passed, then denied: retry after 200ms, full after 2s
}

// One settlement round for three keys: charge what an instance spent, give
// back what it did not, and take an allowance for the next round.
func ExampleLimiter_Settle() {
	_, rdb, stop := exampleRedis(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	defer stop()
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		panic(err)
	}
	lim, err := global.Limit{Rate: 5, Burst: 10}.Micro()
	if err != nil {
		panic(err)
	}
	const tok = limit.Micro
	batch := []global.Settlement{
		{Key: "alice", Limit: lim, Want: 4 * tok, MinGrant: 1 * tok},
		{Key: "bob", Limit: lim, Consumed: 8 * tok, Want: 4 * tok, MinGrant: 1 * tok},
		{Key: "carol", Limit: lim, Consumed: 25 * tok, Want: 4 * tok, MinGrant: 1 * tok},
	}
	replies := make([]global.Reply, len(batch))
	if err := l.Settle(context.Background(), batch, replies); err != nil {
		panic(err)
	}
	for i, r := range replies {
		fmt.Printf("%s: granted %.1f, left %.1f tokens\n", batch[i].Key, float64(r.Granted)/tok, float64(r.Tokens)/tok)
	}
	// Output:
	// alice: granted 4.0, left 6.0 tokens
	// bob: granted 2.0, left 0.0 tokens
	// carol: granted 0.0, left -10.0 tokens
}

// A settlement with an Instance and a Seq is idempotent: when its reply is
// lost, the caller sends it again as it was, and Redis, which had applied
// it, answers with what it granted then and charges nothing more.
func ExampleLimiter_Settle_resend() {
	_, rdb, stop := exampleRedis(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	defer stop()
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		panic(err)
	}
	lim, err := global.Limit{Rate: 5, Burst: 10}.Micro()
	if err != nil {
		panic(err)
	}
	const tok = limit.Micro
	batch := []global.Settlement{
		{Key: "alice", Limit: lim, Consumed: 3 * tok, Want: 4 * tok, MinGrant: 1 * tok, Instance: "web-7f3a", Seq: 41},
	}
	replies := make([]global.Reply, len(batch))
	for range 2 { // the second time as if the first reply was lost
		if err := l.Settle(context.Background(), batch, replies); err != nil {
			panic(err)
		}
		r := replies[0]
		fmt.Printf("granted %.1f, left %.1f tokens, duplicate %v\n", float64(r.Granted)/tok, float64(r.Tokens)/tok, r.Duplicate)
	}
	// Output:
	// granted 4.0, left 3.0 tokens, duplicate false
	// granted 4.0, left 3.0 tokens, duplicate true
}

func ExampleLimiter_Key() {
	l, err := global.New(redis.NewClient(&redis.Options{}), global.Config{})
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Key("user42"))
	fmt.Println(l.Key("a}b"))
	// Output:
	// hybrid:{user42}
	// hybrid:{a}b}
}

// Three instances beat every 20 s with a TTL of a minute. One leaves on
// shutdown and one crashes: the first is gone at once, the second a minute
// after its last beat.
func ExampleLimiter_Heartbeat() {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m, rdb, stop := exampleRedis(start)
	defer stop()
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	const ttl = time.Minute
	beat := func(at time.Duration, id string) {
		m.SetTime(start.Add(at))
		live, _, err := l.Heartbeat(ctx, id, ttl)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%v: %s beats, %d live\n", at, id, live)
	}
	beat(0, "a")
	beat(0, "b")
	beat(0, "c")
	live, err := l.Leave(ctx, "c", ttl)
	if err != nil {
		panic(err)
	}
	fmt.Printf("0s: c leaves, %d live\n", live)
	// b crashes; a beats on.
	beat(20*time.Second, "a")
	beat(40*time.Second, "a")
	beat(60*time.Second, "a")
	// Output:
	// 0s: a beats, 1 live
	// 0s: b beats, 2 live
	// 0s: c beats, 3 live
	// 0s: c leaves, 2 live
	// 20s: a beats, 2 live
	// 40s: a beats, 2 live
	// 1m0s: a beats, 1 live
}

func ExampleLimiter_FleetKey() {
	l, err := global.New(redis.NewClient(&redis.Options{}), global.Config{})
	if err != nil {
		panic(err)
	}
	fmt.Println(l.FleetKey())
	fmt.Println(l.Key("fleet"))
	// Output:
	// hybrid:fleet{fleet}
	// hybrid:{fleet}
}
