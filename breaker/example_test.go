package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/hybridlimit/hybrid/breaker"
)

func Example() {
	b, err := breaker.New(breaker.Config{
		ConsecutiveFailures: 2,
		OnStateChange: func(from, to breaker.State) {
			fmt.Printf("breaker %v -> %v\n", from, to)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	errDown := errors.New("dial tcp 127.0.0.1:6379: connection refused")
	settle := func(ctx context.Context) error { return errDown } // a Redis round trip

	for range 3 {
		err := b.Do(context.Background(), settle)
		switch {
		case errors.Is(err, breaker.ErrOpen):
			fmt.Println("fallback mode:", err)
		case err != nil:
			fmt.Println("round failed:", err)
		}
	}
	c := b.Counts()
	fmt.Printf("%v, trips %d, rejected %d\n", b.State(), c.Trips, c.Rejected)
	// Output:
	// round failed: dial tcp 127.0.0.1:6379: connection refused
	// breaker closed -> open
	// round failed: dial tcp 127.0.0.1:6379: connection refused
	// fallback mode: breaker: redis: open
	// open, trips 1, rejected 1
}

func ExampleAnswered() {
	b, err := breaker.New(breaker.Config{ConsecutiveFailures: 1})
	if err != nil {
		log.Fatal(err)
	}
	errWrongType := errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
	err = b.Do(context.Background(), func(ctx context.Context) error {
		// Redis replied with an error: the connection is healthy.
		return breaker.Answered(errWrongType)
	})
	fmt.Println(errors.Is(err, errWrongType), b.State())
	// Output:
	// true closed
}
