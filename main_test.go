package hybrid_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// TestMain silences go-redis's own log: the outage tests make every client
// report each refused dial, which buries the test output. What the limiter
// does about those failures is what the tests check.
//
// It also starts every Limiter's rounds one sync interval after New, not at
// a random moment within it: the tests run in fake time, and what they
// check at a round's time (a settle of one interval) assumes its rounds are
// on the interval. TestRetryAfter runs with a phase of its own.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	hybrid.SetFirstRound(0)
	os.Exit(m.Run())
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
