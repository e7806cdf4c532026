package local_test

import (
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/local"
)

// A bucket of 10 tokens refilled at 5 per second, driven by explicit times.
func ExampleBucket() {
	lim, err := local.NewLimit(5, 10)
	if err != nil {
		panic(err)
	}
	b := local.Full(lim, 0)
	allowed := 0
	for range 11 {
		if b.TakeAt(0, lim, 1*local.Micro) {
			allowed++
		}
	}
	fmt.Println("at 0s:", allowed, "allowed, retry after", b.RetryAfter(0, lim, local.Micro))

	allowed = 0
	for range 6 {
		if b.TakeAt(time.Second, lim, 1*local.Micro) {
			allowed++
		}
	}
	fmt.Println("at 1s:", allowed, "allowed, full again after", b.ResetAfter(time.Second, lim))
	// Output:
	// at 0s: 10 allowed, retry after 200ms
	// at 1s: 5 allowed, full again after 2s
}

// An allowance granted ahead of time is spent with no clock read; the entry's
// unspent allowance is handed back when the entry leaves the store.
func ExampleStore() {
	s, err := local.New(local.Config[struct{}]{
		Capacity: 1,
		Shards:   1,
		OnEvict: func(e *local.Entry[struct{}], unused, pending int64) {
			fmt.Printf("%s left with %d tokens unspent\n", e.Key(), unused/local.Micro)
		},
	})
	if err != nil {
		panic(err)
	}
	e, _ := s.GetOrAdd("user:42")
	e.Allowance.Add(3 * local.Micro) // what Redis granted
	for i := range 4 {
		fmt.Println("request", i+1, "allowed:", s.Get("user:42").Allowance.Spend(local.Micro))
	}
	e.Allowance.Add(2 * local.Micro)
	s.GetOrAdd("user:7") // the store is full: user:42 is evicted
	// Output:
	// request 1 allowed: true
	// request 2 allowed: true
	// request 3 allowed: true
	// request 4 allowed: false
	// user:42 left with 2 tokens unspent
}
