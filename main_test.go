package hybrid_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMain silences go-redis's own log: the outage tests make every client
// report each refused dial, which buries the test output. What the limiter
// does about those failures is what the tests check.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
