package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// An in-process Redis stands in for a real one in these examples.
func newRedis() (*miniredis.Miniredis, *redis.Client) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return m, redis.NewClient(&redis.Options{Addr: m.Addr()})
}

func Example() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// Three requests at once, then one a minute, for each user, across
	// every instance that shares this Redis.
	perUser := hybrid.Limit{Rate: 1.0 / 60, Burst: 3}
	for range 4 {
		res, err := lim.Allow(context.Background(), "user:42", perUser)
		if err != nil {
			panic(err) // misuse, or a closed Limiter: a denial is no error
		}
		if res.Allowed {
			fmt.Printf("allowed, %d left\n", res.Remaining)
		} else {
			fmt.Printf("denied, retry in about %v\n", res.RetryAfter.Round(time.Minute))
		}
	}
	// Output:
	// allowed, 2 left
	// allowed, 1 left
	// allowed, 0 left
	// denied, retry in about 1m0s
}

func ExampleLimiter_Handle() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// A limit that most requests ask, kept as a Handle: its decisions skip
	// looking the key up, and are those of lim.Allow on the same key.
	search, err := lim.Handle("api:search", hybrid.Limit{Rate: 1, Burst: 2})
	if err != nil {
		panic(err) // an invalid key or limit
	}
	for range 3 {
		res, err := search.Allow(context.Background())
		if err != nil {
			panic(err)
		}
		fmt.Println("allowed:", res.Allowed)
	}
	// Output:
	// allowed: true
	// allowed: true
	// allowed: false
}

func ExampleReservation_Cancel() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	upload := hybrid.Limit{Rate: 1.0 / 60, Burst: 1}
	r, err := lim.Reserve(context.Background(), "tenant:7", upload, 1)
	if err != nil {
		panic(err)
	}
	fmt.Println("reserved:", r.OK())

	// The upload was rejected for another reason: give the token back.
	r.Cancel()

	res, err := lim.Allow(context.Background(), "tenant:7", upload)
	if err != nil {
		panic(err)
	}
	fmt.Println("next upload allowed:", res.Allowed)
	// Output:
	// reserved: true
	// next upload allowed: true
}

func ExampleLimiter_Wait() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// One job a minute.
	jobs := hybrid.Limit{Rate: 1.0 / 60, Burst: 1}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fmt.Println("first job:", lim.Wait(ctx, "jobs", jobs))

	// The next token is a minute away, past ctx's deadline: Wait says so at
	// once instead of waiting for nothing.
	err = lim.Wait(ctx, "jobs", jobs)
	fmt.Println("second job would wait:", errors.Is(err, hybrid.ErrWouldWait))
	// Output:
	// first job: <nil>
	// second job would wait: true
}

func ExampleLimiter_Peek() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// Ten exports an hour; a quota page shows what is left, and takes none.
	exports := hybrid.Limit{Rate: 10.0 / 3600, Burst: 10, Mode: hybrid.Exact}
	ctx := context.Background()
	for range 7 {
		if _, err := lim.Allow(ctx, "tenant:7", exports); err != nil {
			panic(err)
		}
	}
	res, err := lim.Peek(ctx, "tenant:7", exports, 5)
	if err != nil {
		panic(err)
	}
	fmt.Println("left:", res.Remaining)
	fmt.Println("5 more now:", res.Allowed)
	fmt.Println("5 more in:", res.RetryAfter.Round(time.Minute))
	// Output:
	// left: 3
	// 5 more now: false
	// 5 more in: 12m0s
}

func ExampleLimiter_Reserve() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// One report a second. The second report's token is taken now, ahead of
	// time: the caller waits its Delay before it acts, or gives it back.
	reports := hybrid.Limit{Rate: 1, Burst: 1, Mode: hybrid.Exact}
	ctx := context.Background()
	first, err := lim.Reserve(ctx, "reports", reports, 1)
	if err != nil {
		panic(err)
	}
	second, err := lim.Reserve(ctx, "reports", reports, 1)
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", first.OK(), first.Delay())
	fmt.Println("second:", second.OK(), second.Delay().Round(time.Second))
	second.Cancel() // not needed after all: the next caller has it
	// Output:
	// first: true 0s
	// second: true 1s
}

func ExampleLimiter_Reset() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// Two logins an hour; support unblocks the user after the second.
	logins := hybrid.Limit{Rate: 2.0 / 3600, Burst: 2, Mode: hybrid.Exact}
	ctx := context.Background()
	for range 2 {
		if _, err := lim.Allow(ctx, "login:bob", logins); err != nil {
			panic(err)
		}
	}
	res, _ := lim.Allow(ctx, "login:bob", logins)
	fmt.Println("third login:", res.Allowed)
	if err := lim.Reset(ctx, "login:bob"); err != nil {
		panic(err)
	}
	res, _ = lim.Allow(ctx, "login:bob", logins)
	fmt.Println("after Reset:", res.Allowed)
	// Output:
	// third login: false
	// after Reset: true
}

func ExampleLimiter_Warm() {
	m, rdb := newRedis()
	defer m.Close()
	defer rdb.Close()

	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// Before the service reports itself ready: the first requests then
	// find the connection open and the script loaded. A Redis that does
	// not answer is no reason not to start; the Limiter's fallback
	// decides until it does.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := lim.Warm(ctx); err != nil {
		fmt.Println("Redis not ready:", err)
	}
	res, _ := lim.Allow(context.Background(), "user:42", hybrid.Limit{Rate: 1, Burst: 1})
	fmt.Println(res.Allowed)
	// Output:
	// true
}
